"""ncp-local entry point: `python run.py [group=option ...] [key=value ...]`.

Modes: run (default), lint, merge. See README.md.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from ncp_local.config import REPO_ROOT

OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT), replace=True)
EXIT_BAD_INPUT = 2


def check_overrides(argv: list[str]) -> str | None:
    """Compose the config for the command line; a bad override is one line.

    Hydra itself reports a wrong key or group option in several lines and
    exits 1; checking first keeps the rig's contract (one line, exit 2). A
    sweep (`-m`) is checked value by value, one swept key at a time.
    """
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from ncp_local.config import compose, hydra_error_line

    args = get_args_parser().parse_args(argv)
    if sum(map(bool, (args.run, args.multirun, args.cfg, args.info, args.shell_completion))) > 1:
        return "only one of --run, --multirun, --cfg, --info and --shell-completion can be given"
    if (args.help or args.hydra_help or args.info or args.shell_completion or args.experimental_rerun
            or args.config_path or args.config_dir):
        return None  # not a composition of our own config: leave it to Hydra
    name = args.config_name or "config"
    parser = OverridesParser.create()
    overrides = []
    for line in args.overrides:
        try:
            overrides.append(parser.parse_override(line))
        except Exception as exc:
            return f"config override {line}: {hydra_error_line(exc)}"
    try:
        fixed = [o.input_line for o in overrides if not o.is_sweep_override()]
        # glob() sweeps need Hydra's config loader to expand: left to Hydra.
        sweeps = [(o, values) for o in overrides if o.is_sweep_override() and (values := _sweep_values(o))]
        if not args.multirun:
            compose(args.overrides, name)
            return None
        first = [f"{o.get_key_element()}={values[0]}" for o, values in sweeps]
        cfg = compose(fixed + first, name, hydra_config=True)
        for i, (o, values) in enumerate(sweeps):
            for value in values[1:]:
                compose(fixed + first[:i] + [f"{o.get_key_element()}={value}"] + first[i + 1:], name)
        # Sweeps declared in a config file (`hydra.sweeper.params`, e.g. experiment=auditor_sensitivity).
        params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
        given = {o.get_key_element().lstrip("+~") for o in overrides}
        for key, spec in params.items():
            if key in given:
                continue
            for o in parser.parse_overrides([f"{key}={spec}"]):
                values = _sweep_values(o) if o.is_sweep_override() else [o.get_value_element_as_str()]
                for value in values:
                    compose(fixed + first + [f"{key}={value}"], name)
    except HydraException as exc:
        return f"config override: {hydra_error_line(exc)}"
    except Exception as exc:  # Hydra trips over some malformed overrides (e.g. `narrator=[1]`)
        return f"config override: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _sweep_values(override) -> list[str]:
    try:
        return list(override.sweep_string_iterator())
    except Exception:  # glob(): expanding it needs Hydra's config loader
        return []


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from ncp_local.cli import main as cli_main

    code = cli_main(cfg)
    if code:
        sys.exit(code)


# vLLM starts its engine in a spawned process, which re-imports this module.
if __name__ == "__main__":
    problem = check_overrides(sys.argv[1:])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    main()
