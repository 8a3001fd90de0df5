"""Small helpers shared by the engine tests."""

from __future__ import annotations

import socket


# The session's all-in-process reference run (conftest `reference_run`): one spec, two turns, every
# role on the embedded model with a 1 GiB KV cache. The seed gives an episode that commits turn 0 and
# plays turn 1 (test_mixed_engines asserts it); `seed` apart, so a sweep can vary it (test_sweep_engine).
REFERENCE = ("max_turns=2", "limit=1", "progress=false",
             *(f"+{role}.model.kv_cache_memory_bytes={1 << 30}" for role in ("narrator", "player", "auditor")))
REFERENCE_SEED = "seed=0"


def alive_after(pids: list[int], timeout: float) -> list[int]:
    """Pids still running once `timeout` has passed (zombies count as gone)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    still = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                still.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return still


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stage_calls(spec, build: bool = True) -> list[tuple[str, str, dict[str, str], object, str | None]]:
    """One call per stage on real protocol state (after an opening and one exchange):
    (stage, template, variables, ids, extra template). Every schema feature the rig
    uses appears: bounded strings, enums built from state, anyOf/const, prefixItems."""
    from ncp_local.protocol import ledger
    from ncp_local.protocol.episode import audit_ids
    from ncp_local.protocol.ledger import Exchange, FactUpdate
    from ncp_local.protocol.prompts import (
        BUILD_TEMPLATES, conflict_vars, fact_update_vars, narrate_vars, opening_vars, player_vars, status_vars,
        to_json, trajectory_vars,
    )
    from ncp_local.protocol.stages import AuditIds

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
    calls: list[tuple[str, str, dict[str, str], object, str | None]] = [
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
    if build:
        variables = {"player_role": spec.meta.player_role, "synopsis": spec.synopsis,
                     "reference_trajectory": "\n".join(f"[{n.id}] {n.description}" for n in spec.trajectory[:4]),
                     "commitments": "\n".join(f"[{c.id}] ({c.type}) {c.description}" for c in spec.commitments[:3])}
        calls += [(name, name, variables, AuditIds(), None) for name in BUILD_TEMPLATES]
    return calls


def ask_all(engine_session, service, spec_id: str, calls, timeout: float = 1500) -> list:
    """Every call in flight at once through the call service (parse, bounds, retries, call log)."""
    import asyncio

    async def go() -> list:
        return await asyncio.gather(*(
            service.ask(spec_id, 0, stage, template, variables, ids=ids, key=template, extra=extra,
                        role="auditor" if stage.startswith("build_") else None)
            for stage, template, variables, ids, extra in calls))

    return engine_session.run(go(), timeout=timeout)


def embedded_roles() -> dict:
    """{role: (Sampling, Bounds)} exactly as the default config's role files
    (conf/*/smollm2.yaml) give them, so engine tests never drift from what a
    user's run asks of the embedded model."""
    from omegaconf import OmegaConf

    from ncp_local.config import compose, validate
    from ncp_local.execution.calls import Sampling

    cfg = validate(OmegaConf.to_container(compose(["dataset.path=specs"]), resolve=True))
    return {r: (Sampling(getattr(cfg, r).temperature, getattr(cfg, r).top_p, getattr(cfg, r).max_tokens),
                getattr(cfg, r).bounds) for r in ("narrator", "player", "auditor")}
