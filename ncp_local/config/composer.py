"""The config composed outside `hydra.main` (as `run.py` would get it for some overrides), and Hydra's
errors as one line each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import OmegaConf

from ..resources import CONF_DIR, ROOT
from .suggest import dotted_keys, unknown_override_line

# Where conf/, prompts/ and specs/ lie: the checkout, or the installed package (resources.py). The
# `${repo_root:}` resolver (conf/dataset/local.yaml) and the run's git probe read it.
REPO_ROOT = ROOT


def compose(overrides: list[str], config_name: str = "config", hydra_config: bool = False) -> Any:
    """The config `run.py` would get for these overrides, outside `hydra.main`.

    Used to check overrides up front and by the Slurm submitter to name the
    run directory once. Raises Hydra's own exceptions (see `hydra_error_line`).
    """
    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT), replace=True)
    # Inside a running Hydra app (a mode composing its sweep's points, mode=bench) Hydra refuses a
    # second initialisation: step aside from the app's Hydra and put it back after.
    running = get_gh_backup() if GlobalHydra.instance().is_initialized() else None
    if running is not None:
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name, overrides=overrides, return_hydra_config=hydra_config)
    finally:
        if running is not None:
            restore_gh_from_backup(running)


def bounded(line: str, limit: int = 500) -> str:
    """An error line cut to `limit` characters (Hydra quotes a whole override, which can be long)."""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def hydra_error_line(exc: BaseException) -> str:
    """Hydra's multi-line composition error as one line (options listed inline)."""
    parts: list[str] = []
    options: list[str] = []
    for line in str(exc).split("Config search path:")[0].splitlines():
        if line.startswith("\t"):
            options.append(line.strip())
        elif line.strip() and not line.startswith("Available options"):
            parts.append(line.strip().rstrip("."))
    text = "; ".join(parts)
    if options:
        text += f" (available: {', '.join(options)})"
    return text


def override_error_line(exc: BaseException, overrides: Sequence[str], name: str = "config") -> str:
    """Hydra's error composing these overrides as the rig's one line, for every entry (run.py,
    `ncp-local`, slurm/submit.py): an unknown key or group option with the closest real one ("did you
    mean ...?", never Hydra's `+key` advice), any other error as `config override: <Hydra's line>`."""
    known = unknown_override_line(str(exc), lambda: config_keys(overrides, name))
    return known or f"config override: {hydra_error_line(exc)}"


def config_keys(overrides: Sequence[str], name: str = "config") -> list[str]:
    """The dotted keys of the config these overrides choose (their groups' keys included).

    Composed without the overrides Hydra refuses on their own (the misspelt one among them), so a
    misspelt key is compared with the keys the user's groups do have; the defaults' keys when even
    that composition fails.
    """
    for attempt in ([o for o in overrides if "=" in o and not _refused(o, name)], []):
        try:
            tree = OmegaConf.to_container(compose(list(attempt), name), resolve=False)
        except Exception:
            continue
        return list(dotted_keys(tree)) if isinstance(tree, dict) else []
    return []


def _refused(override: str, name: str) -> bool:
    """Whether Hydra refuses this override by itself (an unknown key or option)."""
    try:
        compose([override], name)
    except Exception:
        return True
    return False
