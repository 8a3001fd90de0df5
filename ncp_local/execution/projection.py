"""The plan's prompt projection, played or measured: `mode=plan` fits these (plan/growth.py).

Playing runs the real episode code (the configured narrator method, player
condition, prompt pack and dataset) on scripted answers of the stated sizes,
through the same call service as a run; measuring reads a run's call log.
Turns count from 1; the opening is turn 0.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..bindings import Sampling
from ..config import ConfigError, RunConfig
from ..engines.scripted import ScriptedEngine
from ..plan.growth import Growth, Sizes, counters, fit, longest_specs, sized_answers, words_of
from ..protocol import ROLES
from ..protocol.stages import UNBOUNDED, Bounds
from ..protocol.turns import shown as shown_turn
from ..rundir.call_log import read_calls
from ..rundir.layout import CALLS
from ..rundir.store import RunDir
from .calls import CallService, RoleBinding
from .scheduler import EpisodeScheduler, EpisodeSettings


def play(
    cfg: RunConfig,
    pc: Any,
    specs: Sequence[Any],
    pack: Any,
    narrator_cls: type,
    narrator_kwargs: dict[str, Any],
    player: Any,
    roles: Sequence[str] = ROLES,
) -> Growth:
    """Play `plan.fit_turns` turns of the longest specs on scripted answers; fit each stage."""
    chosen = longest_specs(specs, pc.fit_specs)
    sizes = Sizes.of(pc, specs)
    counts = counters(cfg, roles)
    answers: dict[str, tuple[str, str]] = {}

    def record(stage: str, role: str, text: str) -> None:
        if len(text) > len(answers.get(stage, ("", ""))[1]):
            answers[stage] = (role, text)

    bounds: dict[str, Bounds | None] = {r: getattr(getattr(cfg, r), "bounds", None) for r in roles}
    rules = sized_answers(sizes, words_of(specs), bounds, record)
    backends = {}
    for r in roles:
        b = ScriptedEngine(rules=rules)
        b.count_tokens = counts[r].count_tokens  # type: ignore[attr-defined]  # HiAgent trims memory with it
        backends[r] = b
    bindings = {
        r: RoleBinding(
            backends[r],
            Sampling(getattr(cfg, r).temperature, getattr(cfg, r).top_p, getattr(cfg, r).max_tokens),
            getattr(cfg, r).model.name,
            bounds[r] or UNBOUNDED,
        )
        for r in roles
    }
    with tempfile.TemporaryDirectory(prefix="ncp-plan-") as tmp:
        store = RunDir(Path(tmp) / "play")
        store.open({"plan": "play"}, "plan")
        scheduler = EpisodeScheduler(
            specs=chosen,
            calls=CallService(roles=bindings, pack=pack, store=store, seed=cfg.seed),
            store=store,
            settings=EpisodeSettings(max_turns=pc.fit_turns, concurrency=len(chosen), play_through=True),
            make_narrator=lambda: narrator_cls(pack=pack, roles=bindings, **narrator_kwargs),
            player=player,
        )
        try:
            asyncio.run(scheduler.run())
        finally:
            store.close()
    prompts: dict[str, dict[int, int]] = {}
    role_of: dict[str, str] = {}
    for r in roles:
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
    return fit(prompts, need, role_of, source, {r: counts[r].label for r in roles})


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
