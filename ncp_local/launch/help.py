"""`python run.py --help`: the modes, the config groups and their options, as they can be used.

Hydra's own list of groups offers `model` as if `model=qwen3_8b` were a
choice; it is not: a model is chosen for a role (`model@narrator.model=...`),
and the role files choose one already. The text here is built from the
conf/ tree when the help is asked for (the `ncp_help` resolver in
conf/hydra/help/ncp.yaml), so a new option shows up without editing it.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ..modes import MODES
from ..protocol import ROLES
from ..resources import CONF_DIR

# Groups chosen through a role rather than by themselves, and how.
ROLE_GROUPS = {"model": ROLES}
GROUP_NOTES = {
    "experiment": "presets on top of everything else",
    "engine": "vllm (in-process), openai (an endpoint), scripted (no model)",
}


def _options(group: Path) -> list[str]:
    return sorted(p.stem for p in group.glob("*.yaml"))


def groups_text(conf: Path = CONF_DIR) -> str:
    """One line per config group: how to choose it and its options."""
    lines = []
    for group in sorted(p for p in conf.iterdir() if p.is_dir() and p.name != "hydra"):
        options = ", ".join(_options(group))
        if group.name in ROLE_GROUPS:
            roles = ROLE_GROUPS[group.name]
            lines.append(
                f"  {group.name}@<role>.model=OPTION  (role: {', '.join(roles)}; e.g. "
                f"{group.name}@{roles[0]}.model={_options(group)[0]}): {options}"
            )
            continue
        note = f"  ({GROUP_NOTES[group.name]})" if group.name in GROUP_NOTES else ""
        lines.append(f"  {group.name}=OPTION: {options}{note}")
    launchers = sorted({*_options(conf / "hydra" / "launcher"), "basic"})
    lines.append(
        f"  hydra/launcher=OPTION (sweeps, with -m): {', '.join(launchers)}  (batched: every point in one "
        "process on shared engines)"
    )
    return "\n".join(lines)


def modes_text() -> str:
    width = max(len(m.name) for m in MODES)
    return "\n".join(f"  mode={m.name:<{width}}  {m.help}" for m in MODES)


def help_text() -> str:
    """The whole app help; `$$` because Hydra passes it through string.Template (`$FLAGS_HELP` stays)."""
    return (
        "\n".join(
            [
                "ncp-local: NCP-Bench on local models (narrator, player and auditor on vLLM engines).",
                "",
                "Usage: python run.py [group=option ...] [key=value ...]",
                "       python run.py -m [hydra/launcher=batched] key=a,b other=c,d    (a sweep: every combination)",
                "       (installed as a package: `ncp-local` in place of `python run.py`)",
                "",
                "== Modes (mode=...) ==",
                modes_text(),
                "",
                "== Config groups ==",
                groups_text(),
                "",
                "== Often used ==",
                "  max_turns=N limit=N seed=N concurrency=N out_dir=DIR progress=false progress_every_s=S",
                "  narrator.temperature=T auditor.max_tokens=N dataset=ncp_bench dataset.path=DIR shard.count=N",
                "  trials.count=K trials.vary=[auditor]   (each story K times; the roles sampling anew after trial 0)",
                "  python run.py --cfg job [overrides]   shows the composed config",
                "",
                "== Exit codes ==",
                "  0 ok, 2 bad input (one line names the file or key), 3 engine died, 4 disk full,",
                "  5 systematic failure, 6 a sweep with failed points, 130/143 stopped by a signal (resumable)",
                "",
                "== Hydra's flags ==",
                "$FLAGS_HELP",
                "See README.md and docs/ (make docs); --hydra-help for Hydra's own groups.",
            ]
        )
        .replace("$", "$$")
        .replace("$$FLAGS_HELP", "$FLAGS_HELP")
    )


def register() -> None:
    OmegaConf.register_new_resolver("ncp_help", help_text, replace=True)
