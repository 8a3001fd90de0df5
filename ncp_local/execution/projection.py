"""The plan's prompt projection, played or measured: `mode=plan` fits these (plan/growth.py).

Playing runs the real episode code (the configured narrator method, player
condition, prompt pack and dataset) on scripted answers of the stated sizes,
played as a run plays (execution/playing.py); measuring reads a run's call log.
Turns count from 1; the opening is turn 0.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import replace
from pathlib import Path

from ..config import ConfigError, PlanCfg
from ..engines.scripted import ScriptedEngine
from ..plan.growth import Growth, Sizes, counters, fit, longest_specs, sized_answers, words_of
from ..protocol import ROLES
from ..protocol.turns import shown as shown_turn
from ..rundir.call_log import read_calls
from ..rundir.layout import CALLS
from ..rundir.store import RunDir
from . import playing
from .progress import Progress
from .ready import Ready


def play(ready: Ready, pc: PlanCfg) -> Growth:
    """Play `pc.fit_turns` turns of the longest specs of `ready`'s dataset on scripted answers, as a run
    plays them (execution/playing.py, on the config's bindings), into a throw-away run directory; fit
    each stage."""
    assert ready.dataset is not None
    cfg, specs = ready.cfg, ready.dataset.specs
    chosen = longest_specs(specs, pc.fit_specs)
    sizes = Sizes.of(pc, specs)
    counts = counters(cfg, ROLES)
    answers: dict[str, tuple[str, str]] = {}

    def record(stage: str, role: str, text: str) -> None:
        if len(text) > len(answers.get(stage, ("", ""))[1]):
            answers[stage] = (role, text)

    rules = sized_answers(sizes, words_of(specs), {r: ready.bindings[r].bounds for r in ROLES}, record)
    backends = {}
    for r in ROLES:
        b = ScriptedEngine(rules=rules)
        b.count_tokens = counts[r].count_tokens  # type: ignore[attr-defined]  # HiAgent trims memory with it
        backends[r] = b
    # Each story once, all at once, every turn played; neither the speculative player nor the optional
    # failure-mode stage, whatever the config asks (the projection has always been of the plain turn).
    played = cfg.model_copy(
        update={
            "max_turns": pc.fit_turns,
            "concurrency": len(chosen),
            "speculative_player": False,
            "audit": cfg.audit.model_copy(update={"failure_modes": False}),
            "trials": cfg.trials.model_copy(update={"count": 1}),
        }
    )
    with tempfile.TemporaryDirectory(prefix="ncp-plan-") as tmp:
        store = RunDir(Path(tmp) / "play")
        store.open({"plan": "play"}, "plan")
        try:
            bar = Progress(enabled=False)
            asyncio.run(
                playing.play(replace(ready, cfg=played), chosen, backends, store, bar, "plan", play_through=True)
            )
        finally:
            store.close()
    prompts: dict[str, dict[int, int]] = {}
    role_of: dict[str, str] = {}
    for r in ROLES:
        for req in backends[r].requests:
            stage = str(req.tags.get("stage"))
            turn = shown_turn(int(req.tags.get("turn", 0)))  # the plan counts as people do: opening 0
            role_of[stage] = str(req.tags.get("role", r))
            n = counts[role_of[stage]].prompt(req.messages)
            by_turn = prompts.setdefault(stage, {})
            by_turn[turn] = max(by_turn.get(turn, 0), n)
    need = {stage: counts[role].answer(text) for stage, (role, text) in answers.items()}
    source = (
        f"played {pc.fit_turns} turns of the {len(chosen)} longest specs ({', '.join(s.id for s in chosen)}) "
        f"with the rig's prompts on scripted answers: {sizes.text()}"
    )
    return fit(prompts, need, role_of, source, {r: counts[r].label for r in ROLES})


def measured(run_dir: str | Path) -> Growth:
    """The same fit from a real run's call log (prompt and generated tokens per stage and turn)."""
    path = Path(run_dir).expanduser() / CALLS
    if not path.is_file():
        raise ConfigError("plan.measured", f"no call log at {path} (give a run directory of mode=run or mode=bench)")
    prompts: dict[str, dict[int, int]] = {}
    need: dict[str, int] = {}
    role_of: dict[str, str] = {}
    for c in read_calls(path):
        if c.prompt_tokens is None:  # never reached the engine
            continue
        stage, turn = c.stage, shown_turn(c.turn)
        role_of[stage] = c.role
        by_turn = prompts.setdefault(stage, {})
        by_turn[turn] = max(by_turn.get(turn, 0), c.prompt_tokens)
        # The answer alone: a thinking model's thought is reserved apart (its thinking_budget).
        answer = (c.generated_tokens or 0) - (c.thought_tokens or 0)
        need[stage] = max(need.get(stage, 0), answer)
    return fit(prompts, need, role_of, f"measured in {path}", {})
