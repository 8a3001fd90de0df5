"""The rig's calls on the real vLLM CPU engine with the embedded model, one at a time: every auditor
stage on real prompts with the role files' own bounds, and (`slow`) a spec built from a synopsis. Whole
episodes on the engine are the session's reference sweep (tests/engine/test_sweep_engine.py,
test_context_limit.py, test_mixed_engines.py).

Content quality is not asserted (a 135M model); form and bookkeeping are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_helpers import embedded_roles
from ncp_local.execution.calls import CallService, RoleBinding
from ncp_local.modes.build import build_all, load_sources
from ncp_local.protocol import ledger
from ncp_local.protocol.episode import ask_modes
from ncp_local.protocol.prompts import (
    OPTIONAL,
    TEMPLATES,
    PromptPack,
    conflict_vars,
    fact_update_vars,
    status_vars,
    to_json,
    trajectory_vars,
)
from ncp_local.protocol.spec import load_dataset
from ncp_local.protocol.stages import (
    AuditIds,
    Conflict,
    ConflictCheckOut,
    DoubleCheckOut,
    FactUpdateOut,
    FailureModesOut,
    StatusOut,
    TrajectoryOut,
)
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.store import RunDir

ROOT = Path(__file__).resolve().parents[2]
SPECS = load_dataset(ROOT / "specs").specs
ROLES = embedded_roles()


def _calls(engine: Any, root: Path) -> tuple[CallService, RunDir]:
    """The rig's call service on the session engine, logging into a run directory at `root`."""
    store = RunDir(root)
    store.open({"test": True}, "engine-test")
    roles = {r: RoleBinding(engine.backend, s, "smollm2", b) for r, (s, b) in ROLES.items()}
    pack = PromptPack.load(required=(*TEMPLATES, *OPTIONAL))  # the failure-mode stage's template too
    return CallService(roles=roles, pack=pack, store=store, seed=0), store


def test_every_auditor_stage_parses_on_real_prompts(engine: Any, tmp_path: Path) -> None:
    spec = SPECS[0]
    service, store = _calls(engine, tmp_path)
    state = ledger.initial_state(spec).model_copy(update={"opening": "You stand at the edge of the forest."})
    projected = ledger.projected_facts(state)
    ids = AuditIds(fact_ids=tuple(f.id for f in projected), commitment_ids=tuple(c.id for c in spec.commitments))
    response = "You hand the basket to your mother and step onto the forest path."
    player_input = "I take the basket and promise to stay on the path."
    update = ledger.FactUpdate(add_facts=("The player carries the basket.",))
    seen = ledger.with_facts(state, projected)
    cvars = conflict_vars(spec, seen, player_input, response, update)
    history = f"NARRATOR: {state.opening}\n\nPLAYER: {player_input}\n\nNARRATOR: {response}"

    async def all_stages() -> list[Any]:
        ask = lambda *a, **k: service.ask(spec.id, 0, *a, **k)  # noqa: E731
        return [
            await ask("fact_update", "fact_update", fact_update_vars(spec, seen, response), ids=ids),
            await ask("conflict_check", "conflict_check", cvars, ids=ids),
            await ask(
                "double_check",
                "double_check",
                {
                    **cvars,
                    "initial_conflicts_json": to_json(
                        [{"type": "fact", "id": "f_0", "target_text": projected[0].text, "reason": "test"}]
                    ),
                },
                ids=ids,
            ),
            await ask("trajectory_check", "trajectory_check", trajectory_vars(spec, 0, seen, history)),
            await ask(
                "status_check",
                "status_check",
                status_vars(spec, seen, state.node_occurred, history),
                ids=AuditIds(commitment_ids=ids.commitment_ids),
            ),
            # audit.failure_modes: a turn whose fact and player-input conflicts stood.
            await ask_modes(
                spec,
                (
                    Conflict(type="fact", id="f_0", reason="test"),
                    Conflict(type="player_input", id="input", reason="test"),
                ),
                cvars,
                projected,
                player_input,
                ask,
            ),
        ]

    try:
        outs = engine.run(all_stages(), timeout=600)
    finally:
        store.close()
    kinds = (FactUpdateOut, ConflictCheckOut, DoubleCheckOut, TrajectoryOut, StatusOut, FailureModesOut)
    assert [type(o) for o in outs] == list(kinds)
    assert [e.id for e in outs[4].statuses] == list(ids.commitment_ids)
    assert [m.conflict for m in outs[5].modes] == ["fact:f_0", "player_input:input"]
    calls = read_calls(tmp_path / "calls.jsonl")
    assert not [c for c in calls if c.error and "cut off" not in c.error], "grammar output failed to parse"


# `slow`: the 135M model writes list items until max_tokens (2,048 tokens, some 4 minutes a call on 2 cores;
# 8 minutes for this test). `make test` keeps the smaller copies: every build stage's answer from the real
# engine parsed (tests/engine/test_official_prompts.py: the official build templates are in its `make test`
# subset) and the whole build on the scripted engine loading and linting (tests/test_build.py).
@pytest.mark.slow
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
