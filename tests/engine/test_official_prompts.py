"""The paper's own prompt files on the real engine: every template rendered on real state, one parsed answer each.

The official templates are long (the double-check is about 22k characters),
so this needs the embedded model's whole 8192-token window. Content quality
is not asserted (a 135M model): that each stage's rendered prompt is
accepted by the engine and its answer passes the stage's contract.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ncp_local import ledger
from ncp_local.episode import audit_ids
from ncp_local.ledger import Exchange, FactUpdate
from ncp_local.prompts import (
    BUILD_TEMPLATES, OFFICIAL_FILES, PromptPack, conflict_vars, fact_update_vars, narrate_vars, opening_vars,
    player_vars, status_vars, to_json, trajectory_vars,
)
from ncp_local.runner import RoleBinding, Runner, RunSettings, Sampling
from ncp_local.spec import load_dataset
from ncp_local.stages import TIGHT, AuditIds, Bounds
from ncp_local.store import RunDir, read_calls

ROOT = Path(__file__).resolve().parents[2]
# The embedded model's role files (conf/*/smollm2.yaml), bounds included.
ROLES = {"narrator": (Sampling(0.6, 0.95, 512), TIGHT), "player": (Sampling(0.6, 0.95, 192), Bounds(player_chars=350)),
         "auditor": (Sampling(0.6, 0.95, 1024), TIGHT)}


def test_every_official_template_gets_a_parsed_answer(engine: Any, official_prompts: Path, tmp_path: Path) -> None:
    pack = PromptPack.load(official_prompts, required=("narrate", "hiagent_narrate", *OFFICIAL_FILES.values()))
    spec = load_dataset(ROOT / "specs").specs[0]
    state = ledger.initial_state(spec)
    opening = "You stand at the edge of the village with a basket on your arm."
    state = state.model_copy(update={"opening": opening, "pending": FactUpdate(add_facts=("The basket is full.",))})
    projected = ledger.projected_facts(state)
    player_input = "I walk straight to the forest and ask the first stranger for a shortcut."
    response = "You step under the trees. A grey wolf watches you from the path and asks where you are going."
    update = FactUpdate(add_facts=("A wolf is on the path.",))
    ids = audit_ids(spec, projected)
    cvars = conflict_vars(spec, state, projected, player_input, response, update)
    after = state.model_copy(update={"exchanges": (Exchange(player_input=player_input, response=response),)})
    history = player_vars(spec, after)["history_text"]
    facts = ledger.apply_update(projected, update)
    calls: list[tuple[str, str, dict[str, str], AuditIds, str | None]] = [
        ("opening", "opening", opening_vars(spec, ledger.initial_state(spec)), AuditIds(), None),
        ("narrate", "narrate", narrate_vars(spec, state, player_input, True), AuditIds(), None),
        ("hiagent_narrate", "hiagent_narrate",
         {**narrate_vars(spec, state, player_input), "working_memory": "(no subgoal yet)"}, AuditIds(),
         "hiagent_memory"),
        ("player", "player_adversarial", player_vars(spec, state), AuditIds(), None),
        ("player", "player_natural", player_vars(spec, state), AuditIds(), None),
        ("fact_update", "fact_update", fact_update_vars(spec, projected, response), ids, None),
        ("conflict_check", "conflict_check", cvars, ids, None),
        ("double_check", "double_check", {**cvars, "initial_conflicts_json": to_json([
            {"type": "commitment", "id": spec.commitments[0].id, "target_text": spec.commitments[0].description,
             "reason": "the wolf appears before the story allows"}])}, ids, None),
        ("trajectory_check", "trajectory_check", trajectory_vars(spec, 0, facts, history), AuditIds(), None),
        ("status_check", "status_check", status_vars(spec, state, facts, state.node_occurred, history),
         AuditIds(commitment_ids=tuple(c.id for c in spec.commitments)), None),
    ]
    build = {"player_role": spec.meta.player_role, "synopsis": spec.synopsis,
             "reference_trajectory": "\n".join(f"[{n.id}] {n.description}" for n in spec.trajectory[:4]),
             "commitments": "\n".join(f"[{c.id}] ({c.type}) {c.description}" for c in spec.commitments[:3])}
    calls += [(name, name, build, AuditIds(), None) for name in BUILD_TEMPLATES]

    store = RunDir(tmp_path)
    store.open({"test": True}, "official-prompts")
    roles = {r: RoleBinding(engine.backend, s, "smollm2", b) for r, (s, b) in ROLES.items()}
    runner = Runner(specs=(), roles=roles, pack=pack, store=store, settings=RunSettings(seed=0),
                    make_narrator=lambda: None, player=None)  # type: ignore[arg-type, return-value]

    async def go() -> list[Any]:
        import asyncio

        return await asyncio.gather(*(
            runner.ask(spec.id, 0, stage, template, variables, ids=i, key=template, extra=extra,
                       role="auditor" if stage.startswith("build_") else None)
            for stage, template, variables, i, extra in calls))

    try:
        answers = engine.run(go(), timeout=1500)
    finally:
        store.close()
    assert len(answers) == len(calls) and all(a is not None for a in answers)
    logged = read_calls(tmp_path / "calls.jsonl")
    ok = {c["key"] for c in logged if c.get("error") is None}
    assert ok == {template for _, template, *_ in calls}
    # Every prompt was the official file's text with the state filled in.
    for c in logged:
        assert c["prompt_tokens"] > 500, c
