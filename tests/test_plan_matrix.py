"""The plan over the whole matrix: every model file in conf/model/ in every role, alone and combined, on
1, 2, 4 and 8 GPUs of 24 to 192 GB, with the files' settings and with shares, devices and tensor parallel
set. Each combination ends in a verdict (go, overflow, or one fatal line naming a config key), never in a
traceback; and a go is a plan vLLM starts: each engine's KV cache holds one `max_model_len` request, the
shares on a GPU fit it.

`plan.check`, then the prompt projection (played once, on the paper's settings, and projected for every
combination: only memory and windows vary here), then `plan.verdict`: what `mode=plan` does, with no
subprocess. The counts are in SUMMARY (and printed: `pytest -rA` or `-s` shows them).

`make test` judges a seeded sample of SAMPLE combinations (a different sample when the matrix
changes, the same one run after run); the whole matrix is the `slow` tier's (`make test-all`).
"""

from __future__ import annotations

import functools
import random
import re
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from ncp_local import config as config_mod
from ncp_local import plan as plan_mod
from ncp_local.engines.settings import ModelSettings
from ncp_local.modes.plan import full as plan_full
from ncp_local.plan import memory

ROOT = Path(__file__).resolve().parent.parent
MODELS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
GPUS = ("L4-24GB", "A100-40GB", "L40S-48GB", "H100-80GB", "H200-141GB", "B200-192GB")
COUNTS = (1, 2, 4, 8)
VARIANTS = ("as_files", "shares", "devices", "tensor_parallel", "all_set")
TRIPLES = 40  # of the 13 x 12 x 11 = 1716 distinct triples, a fixed sample
PAIRS = 160  # of the 2 x 13 x 12 = 312 pairs both ways round, a fixed sample (the run time grows with the square)
RENDERED = 7  # every 7th combination is also rendered whole (every line one line)
SAMPLE = 3000  # of the 25,560 combinations, for `make test`
from ncp_local.protocol import ROLES  # noqa: E402

# A fatal line says what to change.
SAYS_WHAT = re.compile(r": (set|run on|give|lower|raise|choose|fix|use) ")

SUMMARY: dict[str, Any] = {}


def cfg_for(overrides: list[str]) -> Any:
    raw = OmegaConf.to_container(config_mod.compose(overrides), resolve=True)
    return config_mod.validate(raw)  # type: ignore[arg-type]


def assignments() -> list[tuple[str, str, str]]:
    """(narrator, player, auditor) model files: each alone, a sample of the pairs both ways round (narrator
    and player sharing against the auditor, and the player against the other two), and a sample of
    distinct triples."""
    solo = [(m, m, m) for m in MODELS]
    pairs = [(a, a, b) for a in MODELS for b in MODELS if a != b]
    player = [(a, b, a) for a in MODELS for b in MODELS if a != b]
    triples = [(a, b, c) for a in MODELS for b in MODELS for c in MODELS if len({a, b, c}) == 3]
    rng = random.Random(0)
    return solo + rng.sample(pairs + player, min(PAIRS, len(pairs + player))) + rng.sample(triples, TRIPLES)


@dataclass(frozen=True)
class Case:
    models: tuple[str, str, str]
    gpu: str
    count: int
    variant: str

    @property
    def name(self) -> str:
        return f"{'/'.join(self.models)} on {self.count} x {self.gpu}, {self.variant}"


def cases() -> Iterator[Case]:
    for models in assignments():
        for gpu in GPUS:
            for count in COUNTS:
                for variant in VARIANTS:
                    yield Case(models, gpu, count, variant)


def _model(base: ModelSettings, case: Case, engine: int, engines: int) -> ModelSettings:
    """The model file's settings, changed as the variant says (validated, as a config would be)."""
    if base.path == "embedded":
        return base  # the embedded model keeps its file's fixed share on any hardware
    n = case.count
    tp = base.tensor_parallel_size
    change: dict[str, Any] = {}
    if case.variant in ("tensor_parallel", "all_set"):
        tp = 2 if n == 1 else (n if case.variant == "tensor_parallel" else max(1, n // engines))
        change["tensor_parallel_size"] = tp
    if case.variant in ("devices", "all_set"):
        start = (engine * tp) % max(n, 1)
        change["devices"] = [start + j for j in range(tp)]  # past the last GPU where they run out: refused
    if case.variant in ("shares", "all_set"):
        change["gpu_memory_utilization"] = {1: 0.9, 2: 0.45, 3: 0.3}[engines]
    return ModelSettings.model_validate({**base.model_dump(), **change}) if change else base


def config(base: Any, files: dict[str, ModelSettings], case: Case) -> Any:
    distinct = list(dict.fromkeys(case.models))
    roles = {}
    for role, name in zip(ROLES, case.models, strict=True):
        model = _model(files[name], case, distinct.index(name), len(distinct))
        rc = getattr(base, role)
        roles[role] = rc.model_copy(update={"model": model})
    gpus = [case.gpu] * case.count
    return base.model_copy(update={**roles, "plan": base.plan.model_copy(update={"gpus": gpus})})


def resolves(cfg: Any, key: str) -> bool:
    """A config key the user can set: a path through the config (free-form below a dict such as engine_args)."""
    node = cfg
    for part in key.split("."):
        if isinstance(node, dict):
            return True
        if not hasattr(node, part):
            return False
        node = getattr(node, part)
    return True


def starts(plan: Any) -> list[str]:
    """Why vLLM would not start as planned (nothing for a plan that starts)."""
    why = []
    for e in plan.engines:
        if e.facts is not None and e.kv_bytes < e.window_kv():
            why.append(f"{e.label}: KV {e.kv_bytes} < one request {e.window_kv()}")
    if plan.inventory.kind == "gpu":
        for d in range(len(plan.inventory.gpus)):
            on = [e for e in plan.engines if d in e.devices]
            total = sum(e.share or 0.0 for e in on)
            if total > plan.cfg.plan.max_device_share + 0.001 * len(on) + 1e-9:
                why.append(f"GPU {d}: shares {total:.3f}")
    return why


def judge(cfg: Any, growth: Any, rendered: bool = False) -> tuple[str, str, list[str]]:
    """The verdict, the key a fatal line names (else ""), and what is wrong (nothing when the plan behaves);
    `rendered`: also every line of the printed plan (slower: a sample of the cases)."""
    plan = plan_mod.check(cfg)
    plan_mod.project(plan, growth)
    how, text = plan_mod.verdict(plan)
    wrong = []
    lines = [text, *(p.message for p in plan.problems), *(plan_mod.render(plan) if rendered else ())]
    wrong += [f"two lines: {line!r}" for line in lines if "\n" in line]
    if how == plan_mod.CANNOT:
        first = plan.fatal[0]
        error = f"error: config: {first.field}: plan: {first.message}"  # what mode=plan and mode=run print
        if "\n" in error:
            wrong.append(f"error of two lines: {error!r}")
        if not SAYS_WHAT.search(first.message):
            wrong.append(f"does not say what to change: {error}")
        for p in plan.fatal:
            if not resolves(cfg, p.field):
                wrong.append(f"no such config key {p.field!r}: {p.message}")
        return how, first.field, wrong
    return how, "", wrong + starts(plan)


@pytest.fixture(scope="module")
def growth() -> Any:
    """The prompt projection, played once on the paper's settings with our specs."""
    return plan_full(
        cfg_for(["experiment=paper", "narrator=qwen3", "player=qwen3", "auditor=qwen3", "plan.gpus=[H100-80GB]"])
    ).growth


def test_a_seeded_sample_of_combinations_ends_in_a_verdict(growth: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    every = list(cases())
    judge_all(random.Random(1).sample(every, min(SAMPLE, len(every))), growth, monkeypatch)


@pytest.mark.slow
def test_every_combination_ends_in_a_verdict(growth: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    judge_all(cases(), growth, monkeypatch)


def judge_all(chosen: Any, growth: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A model's facts do not change during the test: read each model directory once, not per combination.
    monkeypatch.setattr(memory, "model_facts", functools.lru_cache(maxsize=None)(memory.model_facts))
    base = cfg_for(["experiment=paper"])
    files = {m: cfg_for([f"model@narrator.model={m}"]).narrator.model for m in MODELS}
    verdicts: Counter[str] = Counter()
    fields: Counter[str] = Counter()
    tracebacks: list[str] = []
    wrong: list[str] = []
    total = 0
    for case in chosen:
        total += 1
        try:
            how, key, bad = judge(config(base, files, case), growth, rendered=total % RENDERED == 0)
        except Exception:  # the point of the test: name the combination and its traceback
            tracebacks.append(f"{case.name}:\n{traceback.format_exc()}")
            continue
        verdicts[how] += 1
        wrong += [f"{case.name}: {b}" for b in bad]
        if key:
            fields[re.sub(r"^(narrator|player|auditor)\b", "<role>", key)] += 1
    SUMMARY.update(combinations=total, tracebacks=len(tracebacks), verdicts=dict(verdicts), keys=dict(fields))
    line = f"{total} combinations, {len(tracebacks)} tracebacks, verdicts: " + ", ".join(
        f"{v} {verdicts[v]}" for v in (plan_mod.GO, plan_mod.OVERFLOW, plan_mod.CANNOT)
    )
    print(line)
    print("keys the refusals name: " + ", ".join(f"{k} {n}" for k, n in fields.most_common()))
    assert not tracebacks, f"{line}\n{tracebacks[0]}"
    assert not wrong, f"{line}; {len(wrong)} wrong, first: {wrong[:5]}"
    assert all(verdicts[v] for v in (plan_mod.GO, plan_mod.OVERFLOW, plan_mod.CANNOT)), line
    SUMMARY["line"] = line + "; each verdict seen"
