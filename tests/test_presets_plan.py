"""Every `mode=plan` command that names its hardware (`plan.gpus=[...]`), in README.md, in the
documentation (docs/**/*.md) and in the experiment presets' own comments, plans as it says it does on that
hardware: go unless its comment says `exit 2` (then refused in one line) or `exit 1` (then it starts, and
only the prompt projection can say more). Every experiment preset is planned too: on the hardware its
comments name, else (no GPU model in it) on this CPU. The memory and window checks only (`plan.check`,
what `mode=run` makes first): no prompt play, no dataset.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from ncp_local import config as config_mod
from ncp_local import plan as plan_mod
from ncp_local.protocol import ROLES

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted((ROOT / "conf" / "experiment").glob("*.yaml"))
# Where commands are documented: the README and the site's pages.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Inputs of other modes, and the dataset's location: nothing the memory plan reads.
IGNORED = ("dataset.path=", "runs=", "out_dir=", "hydra/launcher=")


def cfg_for(overrides: list[str]) -> Any:
    raw = OmegaConf.to_container(config_mod.compose(overrides), resolve=True)
    return config_mod.validate(raw)  # type: ignore[arg-type]


def _sweep_of(preset: str) -> dict[str, str]:
    """The preset's own sweep (hydra.sweeper.params), run by `-m experiment=<preset>`."""
    path = ROOT / "conf" / "experiment" / f"{preset}.yaml"
    if not path.is_file():
        return {}
    params = (OmegaConf.load(path).get("hydra") or {}).get("sweeper", {}).get("params", {}) or {}
    return {str(k): str(v) for k, v in params.items()}


def points(tokens: list[str]) -> list[list[str]]:
    """A command's runs: a `-m` sweep (`k=a,b`, and the preset's own sweep where the command leaves it) as its
    single points; brackets are lists, not sweeps."""
    multirun = "-m" in tokens or "--multirun" in tokens
    tokens = [t for t in tokens if "=" in t and not t.startswith(IGNORED)]
    if multirun:
        keys = {t.partition("=")[0] for t in tokens}
        preset = next((t.partition("=")[2] for t in tokens if t.startswith("experiment=")), "")
        tokens += [f"{k}={v}" for k, v in _sweep_of(preset).items() if k not in keys]
    choices = []
    for t in tokens:
        key, _, value = t.partition("=")
        if multirun and "," in value and not value.startswith("["):
            choices.append([f"{key}={v}" for v in value.split(",")])
        else:
            choices.append([t])
    return [list(c) for c in itertools.product(*choices)]


def expected(comment: str) -> str:
    """What the command's own comment says it does: exit 2 (refused), exit 1 (overflow), else go."""
    if re.search(r"exit 2|no-go|refused|cannot", comment):
        return plan_mod.CANNOT
    if re.search(r"exit 1|overflow", comment):
        return plan_mod.OVERFLOW
    return plan_mod.GO


def commands(path: Path) -> list[tuple[str, list[str], str]]:
    """(where, tokens, expected verdict) of every `run.py` line in `path` that names hardware."""
    out = []
    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT / "docs") else path.name
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if "run.py" not in line or "plan.gpus=" not in line:
            continue
        text = line.split("run.py", 1)[1]
        text = text.split("`", 1)[0]  # a command quoted in prose ends at its backtick
        command, _, comment = text.partition("#")
        out.append((f"{name}:{n}", shlex.split(command), expected(comment)))
    return out


def readme_and_preset_commands() -> list[tuple[str, list[str], str]]:
    found = [c for doc in DOCS for c in commands(doc)]
    for preset in PRESETS:
        found += commands(preset)
    return [(f"{where} {' '.join(p)}", p, verdict) for where, tokens, verdict in found for p in points(tokens)]


CASES = readme_and_preset_commands()


def verdict(cfg: Any) -> tuple[str, Any]:
    """The plan's verdict on memory and windows (an overflow needs the prompt projection: it counts as go)."""
    p = plan_mod.check(cfg)
    return (plan_mod.CANNOT if p.fatal else plan_mod.GO), p


def test_the_readme_and_the_presets_name_hardware() -> None:
    where = {case[0].split(":")[0] for case in CASES}
    assert "README.md" in where and "docs/guide/models-and-gpus.md" in where and "auditor_sensitivity.yaml" in where
    # auditor_sensitivity's sweep expands: its four auditors on two GPUs, on one 141 GB GPU, three on one 80 GB.
    assert sum("auditor_sensitivity.yaml" in c[0] for c in CASES) >= 4 + 4 + 3


@pytest.mark.parametrize(("where", "overrides", "want"), CASES, ids=[c[0] for c in CASES])
def test_command_plans_as_it_says(where: str, overrides: list[str], want: str) -> None:
    got, p = verdict(cfg_for(overrides))
    messages = [f"{f.field}: {f.message}" for f in p.fatal]
    if want == plan_mod.CANNOT:
        assert got == plan_mod.CANNOT, f"{where}: expected a refusal, the plan goes"
        assert all("\n" not in m for m in messages)
    else:
        assert got == plan_mod.GO, f"{where}: {messages}"
        for e in p.engines:  # what vLLM checks at start: one max_model_len request in the KV cache
            assert e.kv_bytes >= e.window_kv(), (where, e.label)


def test_the_paper_command_on_one_80gb_gpu_is_refused_with_the_32b_auditor_needing_two() -> None:
    """The guide (docs/guide/models-and-gpus.md): the paper command "on one 80 GB GPU stops with one line saying
    the 32B auditor needs two"."""
    readme = [c for c in CASES if c[0].startswith("docs/guide/models-and-gpus.md") and "auditor=qwen3_32b" in c[1]]
    assert readme, "the guide's paper plan command"
    one = [t if not t.startswith("plan.gpus=") else "plan.gpus=[H100-80GB]" for t in readme[0][1]]
    got, p = verdict(cfg_for(one))
    assert got == plan_mod.CANNOT
    first = p.fatal[0]
    assert first.field == "auditor.model.tensor_parallel_size" and "run on 2 GPUs" in first.message


def _uses_gpu_models(overrides: list[str]) -> bool:
    cfg = cfg_for(overrides)
    return any(getattr(cfg, r).model.path != "embedded" for r in ROLES)


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_every_preset_plans_on_the_hardware_it_names(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    named = [c for c in CASES if f"experiment={preset}" in c[1]]
    runs = points(["-m", f"experiment={preset}"])
    if any(_uses_gpu_models(r) for r in runs):
        # A preset that puts a role on a GPU model says on what hardware it plans (the cases above check it).
        assert named, f"{preset}: no `mode=plan ... plan.gpus=[...]` command in the README, the docs or the preset"
        return
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: this CPU
    for r in runs:
        got, p = verdict(cfg_for(r))
        assert got == plan_mod.GO, (preset, r, [f.message for f in p.fatal])


def test_the_one_gpu_recipe_makes_two_engines() -> None:
    """The preset's one-GPU recipe unpins the player too: narrator and player keep one engine."""
    recipe = next(
        c
        for c in CASES
        if c[0].startswith("auditor_sensitivity.yaml")
        and "plan.gpus=[H200-141GB]" in c[1]
        and "auditor=gemma3_12b" in c[1]
    )
    p = plan_mod.check(cfg_for(recipe[1]))
    names = sorted(e.name for e in p.engines)
    assert len(p.engines) == 2 and names.count("qwen3-8b") == 1, names
    assert next(e for e in p.engines if "narrator" in e.roles).roles[:2] == ("narrator", "player")


def test_one_80gb_gpu_cannot_hold_the_narrator_beside_the_mistral_auditor() -> None:
    """What the preset says of its one-GPU recipe: Mistral-Small-24B needs more than one 80 GB GPU."""
    one = [
        "experiment=auditor_sensitivity",
        "narrator.model.devices=[]",
        "player.model.devices=[]",
        "auditor.model.devices=[]",
        "auditor=mistral_small_24b",
        "plan.gpus=[H100-80GB]",
    ]
    got, p = verdict(cfg_for(one))
    assert got == plan_mod.CANNOT and "\n" not in p.fatal[0].message
