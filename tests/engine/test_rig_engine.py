"""The whole rig on the real vLLM CPU engine with the embedded model.

Content quality is not asserted (a 135M model); form, bookkeeping and
reproducibility are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_helpers import embedded_roles

from ncp_local.protocol import ledger
from ncp_local.modes.build import build_all, load_sources
from ncp_local.protocol.hiagent import HiAgentNarrator
from ncp_local.protocol.prompts import (
    TEMPLATES, PromptPack, conflict_vars, fact_update_vars, status_vars, to_json, trajectory_vars,
)
from ncp_local.protocol.narrators import BaselineNarrator
from ncp_local.protocol.player import Player
from ncp_local.execution.calls import CallService, RoleBinding
from ncp_local.execution.scheduler import EpisodeScheduler, EpisodeSettings
from ncp_local.protocol.spec import load_dataset
from ncp_local.protocol.stages import AuditIds, ConflictCheckOut, DoubleCheckOut, FactUpdateOut, StatusOut, TrajectoryOut
from ncp_local.execution.store import RunDir, read_calls

ROOT = Path(__file__).resolve().parents[2]
SPECS = load_dataset(ROOT / "specs").specs
ROLES = embedded_roles()


def _runner(engine: Any, root: Path, specs: tuple, method: type = BaselineNarrator, condition: str = "adversarial",
            turns: int = 2, seed: int = 0, speculative: bool = False) -> tuple[EpisodeScheduler, RunDir]:
    pack = PromptPack.load(required=TEMPLATES + getattr(method, "TEMPLATES", ()))
    store = RunDir(root)
    store.open({"test": True}, "engine-test")
    roles = {r: RoleBinding(engine.backend, s, "smollm2", b) for r, (s, b) in ROLES.items()}
    runner = EpisodeScheduler(specs=specs, calls=CallService(roles=roles, pack=pack, store=store, seed=seed),
                              store=store, settings=EpisodeSettings(max_turns=turns, concurrency=8,
                                                       speculative_player=speculative),
                              make_narrator=lambda: method(pack=pack, roles=roles), player=Player(condition))
    return runner, store


def _run(engine: Any, root: Path, specs: tuple, **kw: Any) -> tuple[dict, list[dict]]:
    runner, store = _runner(engine, root, specs, **kw)
    try:
        results = engine.run(runner.run(), timeout=900)
    finally:
        store.close()
    return results, read_calls(root / "calls.jsonl")


def _expected_calls(result: Any) -> int:
    """Successful calls an episode must have logged, from its own record."""
    n = 2  # opening + its fact update
    for t in result.turns:
        n += 4  # player, narrate, fact_update, conflict_check
        n += t.double_check is not None
        if not t.conflicts:
            n += t.trajectory_check is not None
            n += t.status_check is not None
    return n


def test_every_auditor_stage_parses_on_real_prompts(engine: Any, tmp_path: Path) -> None:
    spec = SPECS[0]
    runner, store = _runner(engine, tmp_path, (spec,))
    state = ledger.initial_state(spec).model_copy(update={"opening": "You stand at the edge of the forest."})
    projected = ledger.projected_facts(state)
    ids = AuditIds(fact_ids=tuple(f.id for f in projected), commitment_ids=tuple(c.id for c in spec.commitments))
    response = "You hand the basket to your mother and step onto the forest path."
    player_input = "I take the basket and promise to stay on the path."
    update = ledger.FactUpdate(add_facts=("The player carries the basket.",))
    cvars = conflict_vars(spec, state, projected, player_input, response, update)
    history = f"NARRATOR: {state.opening}\n\nPLAYER: {player_input}\n\nNARRATOR: {response}"

    async def all_stages() -> list[Any]:
        ask = lambda *a, **k: runner.calls.ask(spec.id, 0, *a, **k)  # noqa: E731
        return [
            await ask("fact_update", "fact_update", fact_update_vars(spec, projected, response), ids=ids),
            await ask("conflict_check", "conflict_check", cvars, ids=ids),
            await ask("double_check", "double_check",
                      {**cvars, "initial_conflicts_json": to_json([{"type": "fact", "id": "f_0",
                                                                    "target_text": projected[0].text,
                                                                    "reason": "test"}])}, ids=ids),
            await ask("trajectory_check", "trajectory_check", trajectory_vars(spec, 0, projected, history)),
            await ask("status_check", "status_check", status_vars(spec, state, projected, state.node_occurred,
                                                                  history),
                      ids=AuditIds(commitment_ids=ids.commitment_ids)),
        ]

    try:
        outs = engine.run(all_stages(), timeout=600)
    finally:
        store.close()
    kinds = (FactUpdateOut, ConflictCheckOut, DoubleCheckOut, TrajectoryOut, StatusOut)
    assert [type(o) for o in outs] == list(kinds)
    assert [e.id for e in outs[4].statuses] == list(ids.commitment_ids)
    calls = read_calls(tmp_path / "calls.jsonl")
    assert not [c for c in calls if c["error"] and "cut off" not in c["error"]], "grammar output failed to parse"


def test_two_specs_two_turns_log_every_call(engine: Any, tmp_path: Path) -> None:
    # Reproducibility on the real engine (same seed, other batch neighbours, another process:
    # byte-identical results) is tests/engine/test_sweep_engine.py's.
    specs = SPECS[:2]
    first, calls = _run(engine, tmp_path / "a", specs)
    assert set(first) == {s.id for s in specs}
    for r in first.values():
        assert r.termination in ("conflict", "max_turns", "all_resolved", "invalid")
        assert "bad JSON" not in r.reason and "schema" not in r.reason
        ok = [c for c in calls if c["spec_id"] == r.spec_id and c["error"] is None]
        if r.termination != "invalid":
            assert len(ok) == _expected_calls(r)
    for c in calls:
        for key in ("stage", "attempt", "seed", "prompt_tokens", "cached_tokens", "generated_tokens", "latency_s",
                    "finish_reason"):
            assert key in c, (key, c)
        assert c["prompt_tokens"] > 0 and c["generated_tokens"] > 0
        assert c["error"] is None or "cut off" in c["error"], c
    assert sum(c["cached_tokens"] for c in calls) > 0  # prefixes shared between calls are reused
    # The next turn's player asked while the audits run: the same results, byte for byte, on the
    # embedded model (other batch neighbours for every call of the turn).
    early, early_calls = _run(engine, tmp_path / "speculative", specs, speculative=True)
    assert {k: v.model_dump_json() for k, v in early.items()} == {k: v.model_dump_json() for k, v in first.items()}
    def order(log: list[dict], sid: str) -> list[tuple]:
        return [(c["turn"], c["stage"], c["attempt"], c["seed"]) for c in log
                if c["spec_id"] == sid and not c.get("speculative")]

    assert all(order(early_calls, sid) == order(calls, sid) for sid in first)


def test_hiagent_natural(engine: Any, tmp_path: Path) -> None:
    # The baseline narrator against the adversarial player is the test above.
    hi, calls = _run(engine, tmp_path / "hi", SPECS[:1], method=HiAgentNarrator, condition="natural", turns=2)
    r = hi[SPECS[0].id]
    assert r.termination != "invalid", r.reason
    narrate = [c for c in calls if c["stage"] == "hiagent_narrate" and c["error"] is None]
    assert len(narrate) >= min(len(r.turns), 1)
    cp_state = json.loads((tmp_path / "hi" / "results" / f"{SPECS[0].id}.json").read_text())
    assert cp_state["spec_id"] == SPECS[0].id


def test_build_from_synopsis_loads_and_lints(engine: Any, tmp_path: Path) -> None:
    source = load_sources(ROOT / "specs" / "sources.yaml")[0]
    store = RunDir(tmp_path / "out" / ".build")
    store.open({}, "build")
    sampling, bounds = ROLES["auditor"]
    roles = {"auditor": RoleBinding(engine.backend, sampling, "smollm2", bounds)}
    calls = CallService(roles=roles, pack=PromptPack.load(required=()), store=store, seed=0)
    try:
        status = engine.run(build_all(calls, [source], tmp_path / "out"), timeout=900)
    finally:
        store.close()
    assert status[source.id] == "ok", status
    ds = load_dataset(tmp_path / "out")
    assert [s.id for s in ds.specs] == [source.id] and ds.warnings == ()
    spec = ds.specs[0]
    assert spec.trajectory and spec.commitments and spec.initial_facts
    assert any(c.type == "achievement" for c in spec.commitments)
