"""PROTOCOL sections 3 and 5 on the scripted backend: every branch of a turn."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from helpers import Scripted, conflicts, facts, make_spec, prompt, statuses, tag, traj
from ncp_local.engines.base import Completion, Request
from ncp_local.execution.calls import call_seed
from ncp_local.protocol.metrics import episode_metrics
from ncp_local.protocol.records import ConflictRecord


def test_opening_updates_pending_on_turn_0_then_applied_first(tmp_path: Path) -> None:
    spec = make_spec(n_facts=2)

    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage == "fact_update" and turn == -1:
            return facts(add=["the door is red"], negate=["f_0"])
        if stage == "fact_update" and turn == 0:
            return facts(add=["the lamp is lit"])
        return None

    run = Scripted(tmp_path, [spec], rules, max_turns=2)
    result = run.run()["tiny"]
    narrate0 = prompt(run.requests("narrate", turn=0)[0])
    assert "FACT UPDATES FROM THE OPENING" in narrate0 and "+ add: the door is red" in narrate0
    assert "- negate [f_0] initial fact 0" in narrate0
    assert "[f_0] initial fact 0" in narrate0  # still committed (active) on turn 0
    # Turn 0's auditors judge against the projected ledger: opening updates applied.
    fu0 = prompt(run.requests("fact_update", turn=0)[0])
    assert "[f_2] the door is red" in fu0 and "[f_0]" not in fu0
    assert "the door is red" not in prompt(run.requests("narrate", turn=1)[0]).split("FACT UPDATES FROM THE OPENING")[1]
    ledger_ids = [(f.id, f.text, f.active) for f in result.final_state.facts]
    assert ledger_ids == [
        ("f_0", "initial fact 0 of tiny", False),
        ("f_1", "initial fact 1 of tiny", True),
        ("f_2", "the door is red", True),
        ("f_3", "the lamp is lit", True),
    ]
    assert result.opening_update.add_facts == ("the door is red",)


def test_conflict_leaves_committed_state_untouched(tmp_path: Path) -> None:
    spec = make_spec()

    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage == "fact_update" and turn >= 0:
            return facts(add=[f"fact from turn {turn}"])
        if stage == "trajectory_check":
            return traj(True)
        if stage == "status_check":
            return statuses(req, {"c_0"} if turn == 0 else set())
        if stage == "conflict_check" and turn == 1:
            return conflicts([("fact", "f_1")])
        if stage == "double_check":
            return conflicts([("fact", "f_1")], confirmed=True, review_reason="holds")
        return None

    run = Scripted(tmp_path, [spec], rules, max_turns=5)
    result = run.run()["tiny"]
    assert result.termination == "conflict"
    assert len(result.turns) == 2  # the conflicting turn is recorded
    last = result.turns[-1]
    assert last.conflicts == (ConflictRecord(type="fact", id="f_1", reason="r"),)
    assert last.double_check is not None and last.double_check.confirmed is True
    assert last.conflict_check.counts.fact == 1
    # State as after turn 0: turn 1's fact, node and statuses never committed.
    st = result.final_state
    assert [f.text for f in st.facts][-1] == "fact from turn 0"
    assert st.node_occurred == (True, False, False)
    assert st.status_map == {"c_0": "satisfied", "c_1": "pending"}
    assert len(st.exchanges) == 1
    assert not run.requests("trajectory_check", turn=1) and not run.requests("status_check", turn=1)
    m = episode_metrics(result)
    assert (m.turns, m.fact, m.commitment, m.player_input) == (2, True, False, False)
    assert m.trajectory_progress == pytest.approx(1 / 3) and m.satisfied == pytest.approx(0.5)


def test_double_check_can_overturn_and_sees_resolved_targets(tmp_path: Path) -> None:
    spec = make_spec()

    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage == "conflict_check":
            return conflicts([("commitment", "c_1"), ("player_input", "player_input")])
        if stage == "double_check" and turn == 0:
            return conflicts([("commitment", "c_1")], confirmed=False, review_reason="no")
        if stage == "double_check":
            return conflicts([], confirmed=True, review_reason="empty list")
        return None

    run = Scripted(tmp_path, [spec], rules, max_turns=3)
    result = run.run()["tiny"]
    assert result.termination == "max_turns" and len(result.turns) == 3
    assert all(t.conflicts == () for t in result.turns)
    dc = prompt(run.requests("double_check", turn=0)[0])
    reported = dc.split("REPORTED CONFLICTS (by another auditor, each with the text it names):\n")[1]
    resolved, _ = json.JSONDecoder().raw_decode(reported)
    player_input = result.turns[0].player_input
    assert resolved[0]["target_text"] == "commitment 1 of tiny"
    assert resolved[1]["target_text"] == player_input


def test_at_most_one_node_per_turn_first_pending_only(tmp_path: Path) -> None:
    spec = make_spec(n_nodes=3)
    run = Scripted(tmp_path, [spec], lambda r: traj(True) if tag(r)[0] == "trajectory_check" else None, max_turns=5)
    result = run.run()["tiny"]
    assert [t.node_completed for t in result.turns] == ["s_0", "s_1", "s_2", None, None]
    asked = [
        prompt(r).split("STORY BEAT TO CHECK:")[1].strip().split("\n")[0] for r in run.requests("trajectory_check")
    ]
    assert asked == ["[s_0]", "[s_1]", "[s_2]"]  # shown without its description; none once all occurred
    assert "node 0 description" not in prompt(run.requests("trajectory_check")[0]).split("STORY BEAT TO CHECK:")[1]


def test_commitment_can_fall_back_to_pending(tmp_path: Path) -> None:
    spec = make_spec(types=("invariant", "achievement", "achievement"))
    plan = {0: {"c_0", "c_1"}, 1: {"c_1"}, 2: {"c_0"}}
    run = Scripted(
        tmp_path, [spec], lambda r: statuses(r, plan[tag(r)[2]]) if tag(r)[0] == "status_check" else None, max_turns=3
    )
    result = run.run()["tiny"]
    assert [t.newly_satisfied for t in result.turns] == [("c_0", "c_1"), (), ("c_0",)]
    assert [t.back_to_pending for t in result.turns] == [(), ("c_0",), ("c_1",)]
    assert result.final_state.status_map == {"c_0": "satisfied", "c_1": "pending", "c_2": "pending"}


def test_play_through_is_a_fixed_workload_for_benchmarks(tmp_path: Path) -> None:
    """mode=bench: every turn conflicts and resolves everything, yet the episode plays all its turns."""
    spec = make_spec()

    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage == "fact_update" and turn >= 0:
            return facts(add=[f"fact from turn {turn}"])
        if stage == "conflict_check":
            return conflicts([("fact", "f_1")])
        if stage == "double_check":
            return conflicts([("fact", "f_1")], confirmed=True, review_reason="holds")
        if stage == "status_check":
            return statuses(req, {"c_0", "c_1"})
        return None

    scored = Scripted(tmp_path / "scored", [spec], rules, max_turns=4).run()["tiny"]
    assert scored.termination == "conflict" and len(scored.turns) == 1
    run = Scripted(tmp_path / "bench", [spec], rules, max_turns=4, play_through=True)
    result = run.run()["tiny"]
    assert result.termination == "max_turns" and len(result.turns) == 4
    assert all(t.conflicts for t in result.turns)  # still recorded
    # Each turn commits as if the conflict had not stood: the chain of calls is the full one.
    assert len(result.final_state.exchanges) == 4
    assert [f.text for f in result.final_state.facts][-1] == "fact from turn 3"
    assert len(run.requests("status_check")) == 4 and len(run.requests("double_check")) == 4


def test_all_resolved_before_turn_limit(tmp_path: Path) -> None:
    spec = make_spec(types=("ordering", "achievement", "achievement"))
    # Everything satisfied on the very last allowed turn: all_resolved wins over max_turns.
    run = Scripted(
        tmp_path / "a",
        [spec],
        lambda r: statuses(r, {"c_1", "c_2"} if tag(r)[2] == 2 else {"c_1"}) if tag(r)[0] == "status_check" else None,
        max_turns=3,
    )
    result = run.run()["tiny"]
    assert result.termination == "all_resolved" and len(result.turns) == 3
    run2 = Scripted(
        tmp_path / "b",
        [spec],
        lambda r: statuses(r, {"c_1", "c_2"}) if tag(r)[0] == "status_check" else None,
        max_turns=10,
    )
    assert run2.run()["tiny"].termination == "all_resolved" and len(run2.run()["tiny"].turns) == 1


def test_exhausted_retries_end_one_episode_only(tmp_path: Path) -> None:
    specs = [make_spec("a"), make_spec("b"), make_spec("c")]

    def rules(req: Request) -> Any:
        stage, ep, turn, attempt = tag(req)
        if ep == "b" and stage == "status_check" and turn == 1:
            return "not json at all"
        if ep == "c" and stage == "narrate" and turn == 0 and attempt < 2:
            return Completion(text='{"text": "cut', finish_reason="length")  # retried, then succeeds
        return None

    run = Scripted(tmp_path, specs, rules, max_turns=3)
    results = run.run()
    assert results["a"].termination == "max_turns" and results["c"].termination == "max_turns"
    b = results["b"]
    assert b.termination == "invalid" and "status_check at turn 2" in b.reason and "bad JSON" in b.reason
    assert len(b.turns) == 1  # only the committed turn 0
    log = [c for c in run.calls() if c.spec_id == "b" and c.stage == "status_check" and c.turn == 1]
    assert [c.attempt for c in log] == [0, 1, 2] and all(c.error.startswith("bad JSON") for c in log)
    assert len({c.seed for c in log}) == 3  # each attempt its own seed
    cut = [c for c in run.calls() if c.spec_id == "c" and c.stage == "narrate" and c.turn == 0]
    assert [c.finish_reason for c in cut] == ["length", "length", "stop"]
    assert [c.error is not None for c in cut] == [True, True, False]


def test_player_sees_only_visible_history(tmp_path: Path) -> None:
    spec = make_spec()
    run = Scripted(tmp_path, [spec], None, max_turns=2)
    result = run.run()["tiny"]
    p1 = prompt(run.requests("player", turn=1)[0])
    assert result.opening in p1 and result.turns[0].player_input in p1 and result.turns[0].response in p1
    for hidden in ("initial fact 0", "commitment 0", "node 0 description", "trigger 0"):
        assert hidden not in p1
    assert "a curious visitor" in p1


def test_seed_per_call_is_derived_and_recorded(tmp_path: Path) -> None:
    spec = make_spec()
    run = Scripted(tmp_path, [spec], None, max_turns=1, seed=7)
    run.run()
    for req in run.backend.requests:
        stage, ep, turn, attempt = tag(req)
        assert req.seed == call_seed(7, ep, turn, stage, attempt)
    assert call_seed(7, "tiny", 0, "narrate", 0) != call_seed(8, "tiny", 0, "narrate", 0)
    assert call_seed(7, "tiny", 0, "narrate", 0) != call_seed(7, "tiny", 0, "narrate", 1)


class Crash(BaseException):
    """Stands in for a kill: not an Exception, so nothing catches it on the way out."""


def _results_json(results: dict[str, Any]) -> dict[str, str]:
    return {k: v.model_dump_json() for k, v in results.items()}


def test_resumed_run_equals_uninterrupted(tmp_path: Path) -> None:
    from helpers import RandomPolicy

    specs = [make_spec(f"e{i}", n_nodes=4) for i in range(6)]
    busy = RandomPolicy(conflict_rate=0.08, node_rate=0.4, satisfy_rate=0.3, add_fact_rate=0.6, negate_fact_rate=0.2)
    full = Scripted(tmp_path / "full", specs, None, max_turns=6, policy=busy).run()

    calls = {"n": 0}

    def crash_after(n: int) -> Any:
        def rules(req: Request) -> Any:
            calls["n"] += 1
            if calls["n"] == n:
                raise Crash()
            return None

        return rules

    root = tmp_path / "resumed"
    for n in (37, 23, 11):  # three crashes at different points, each resumed
        calls["n"] = 0
        with pytest.raises((Crash, BaseExceptionGroup)) as crashed:  # raised inside a TaskGroup: grouped
            Scripted(root, specs, crash_after(n), max_turns=6, policy=busy).run()
        assert crashed.type is Crash or crashed.group_contains(Crash)
    assert list((root / "checkpoints").glob("*.jsonl")), "a crash mid-run leaves checkpoints"
    resumed = Scripted(root, specs, None, max_turns=6, policy=busy).run()
    assert _results_json(resumed) == _results_json(full)
    assert not list((root / "checkpoints").glob("*.jsonl"))
    again = Scripted(root, specs, None, max_turns=6, policy=busy)
    again.run()
    assert again.backend.requests == []  # nothing left to do


def test_opening_failure_is_invalid(tmp_path: Path) -> None:
    run = Scripted(tmp_path, [make_spec()], lambda r: '{"text": ""}' if tag(r)[0] == "opening" else None)
    result = run.run()["tiny"]
    assert result.termination == "invalid" and "opening at the opening" in result.reason and result.turns == ()


def test_prompts_reuse_the_previous_turns_prefix(tmp_path: Path) -> None:
    """Everything before the changing state is a prefix of the next turn's prompt (prefix caching)."""
    from helpers import RandomPolicy
    from ncp_local.protocol.spec import load_dataset

    spec = load_dataset(Path(__file__).resolve().parent.parent / "specs").specs[1]
    policy = RandomPolicy(conflict_rate=0, node_rate=0.5, satisfy_rate=0.3, add_fact_rate=1, negate_fact_rate=0)
    run = Scripted(tmp_path, [spec], None, max_turns=4, policy=policy)
    turns = run.run()[spec.id].turns
    # The last passage both prompts show: the status check sees the history through its own turn.
    last_shared = {"narrate": 2, "conflict_check": 2, "player": 2, "status_check": 1}
    for stage, back in last_shared.items():
        for t in (2, 3):
            before, now = prompt(run.requests(stage, turn=t - 1)[0]), prompt(run.requests(stage, turn=t)[0])
            shared = os.path.commonprefix([before, now])
            # The history both show is all still there, unchanged, at the same place, and so is
            # the story material before it.
            assert turns[t - back].response in shared, (stage, t)
            # Only the player and the status check see past player inputs (PROTOCOL section 3).
            assert (turns[0].player_input in shared) == (stage in ("player", "status_check")), (stage, t)
            if stage != "player":
                assert spec.commitments[-1].violation_condition in shared, (stage, t)
            if stage == "status_check":
                assert spec.trajectory[-1].description in shared, (stage, t)


def test_stages_share_prefixes_within_a_turn(tmp_path: Path) -> None:
    """Stages that see the same material read it in the same order, so the engine computes it once.

    The narrator, the conflict check and the double-check start with the
    commitments and the narrator's own passages so far; the double-check is
    the conflict check's prompt with the reported conflicts appended; the
    player of turn t+1 starts with the trajectory check's history of turn t.
    """
    from helpers import RandomPolicy
    from ncp_local.protocol.spec import load_dataset

    spec = load_dataset(Path(__file__).resolve().parent.parent / "specs").specs[0]
    policy = RandomPolicy(conflict_rate=1, overturn_rate=1, node_rate=0.0, satisfy_rate=0.3, add_fact_rate=1)
    run = Scripted(tmp_path, [spec], None, max_turns=3, policy=policy)
    result = run.run()[spec.id]
    assert len(result.turns) == 3
    for t in range(3):
        narrate, conflict, status, double = (
            prompt(run.requests(stage, turn=t)[0])
            for stage in ("narrate", "conflict_check", "status_check", "double_check")
        )
        # The commitments are the common start of every prompt that sees them.
        lead = os.path.commonprefix([narrate, conflict, status, double])
        assert spec.commitments[-1].violation_condition in lead
        # The narrator's passages so far are shared by the narrator and the conflict check.
        last = result.turns[t - 1].response if t else result.opening
        assert last in os.path.commonprefix([narrate, conflict])
        # Double-check = conflict check + reported conflicts.
        assert result.turns[t].response in os.path.commonprefix([conflict, double])
        assert "FACT CHANGES THIS PASSAGE WOULD MAKE" in os.path.commonprefix([conflict, double])
        if t + 1 < 3:
            nxt = prompt(run.requests("player", turn=t + 1)[0])
            check = prompt(run.requests("trajectory_check", turn=t)[0])
            assert result.turns[t].response in os.path.commonprefix([check, nxt])


def test_prompt_pack_with_official_placeholder_names(tmp_path: Path) -> None:
    import shutil

    pack = tmp_path / "pack"
    shutil.copytree(Path(__file__).resolve().parent.parent / "prompts", pack)
    (pack / "narrate.txt").write_text(
        "Role {player_role}\n{system_response_history}\n{narrative_commitments}\n"
        "{current_node}\n{pre_turn_facts}\n{pending_fact_updates}\n{user_input}\n"
        '{{"text": "..."}} is a literal brace\n'
    )
    run = Scripted(tmp_path / "run", [make_spec()], None, max_turns=1, pack_dir=pack)
    run.run()
    text = prompt(run.requests("narrate", turn=0)[0])
    assert "[c_0] (ordering, status: pending) commitment 0 of tiny" in text
    assert "[s_0] node 0 description\n  trigger: trigger 0\n  delta: delta 0" in text
    assert '{"text": "..."} is a literal brace' in text
    from ncp_local.errors import InputError
    from ncp_local.protocol.prompts import PromptPack

    (pack / "status_check.txt").unlink()
    with pytest.raises(InputError, match=r"prompts\.dir: missing template\(s\): status_check\.txt$"):
        PromptPack.load(pack)
    # The usual cause, a misspelt file name, is pointed at.
    (pack / "status_chek.txt").write_text("{facts}")
    with pytest.raises(InputError, match=r"status_check\.txt \(no stage reads status_chek\.txt: misspelt\?\)$"):
        PromptPack.load(pack)


def _both_orders(
    tmp_path: Path, specs: list[Any], policy: Any, max_turns: int, rules: Any = None
) -> tuple[Scripted, Scripted]:
    runs = []
    for on in (False, True):
        run = Scripted(
            tmp_path / f"speculative-{on}", specs, rules, max_turns=max_turns, policy=policy, speculative_player=on
        )
        runs.append(run)
    return runs[0], runs[1]


def test_speculative_player_gives_byte_identical_results(tmp_path: Path) -> None:
    """The next turn's player asked during the audits: the same results, file for file, as asked after;
    the turns that never happened (conflict, all_resolved) leave their player call marked speculative."""
    from helpers import RandomPolicy

    specs = [make_spec(f"e{i}", n_nodes=4) for i in range(12)]
    busy = RandomPolicy(conflict_rate=0.1, node_rate=0.4, satisfy_rate=0.12, add_fact_rate=0.6, negate_fact_rate=0.2)
    seq, spec = _both_orders(tmp_path, specs, busy, max_turns=6)
    a, b = seq.run(), spec.run()
    assert _results_json(a) == _results_json(b)
    for sid in a:
        name = f"{sid}.json"
        assert (seq.root / "results" / name).read_bytes() == (spec.root / "results" / name).read_bytes()
    ends = {r.termination for r in a.values()}
    assert ends == {"conflict", "all_resolved", "max_turns"}, ends  # dropped both ways, and none to drop

    def key(c: dict[str, Any]) -> tuple[Any, ...]:
        return c.spec_id, c.turn, c.stage, c.attempt, c.seed

    used = [c for c in spec.calls() if not c.speculative]
    dropped = [c for c in spec.calls() if c.speculative]
    # The calls that were used are the sequential order's calls, same seeds, each episode's in the same order.
    assert sorted(map(key, used)) == sorted(map(key, seq.calls()))
    for sid in a:
        assert [key(c) for c in used if c.spec_id == sid] == [key(c) for c in seq.calls() if c.spec_id == sid]
    # A dropped call is the player of the turn after a conflict or all_resolved, never at max_turns.
    early_ends = {
        (sid, len(r.turns))
        for sid, r in a.items()
        if r.termination in ("conflict", "all_resolved") and len(r.turns) < 6
    }
    assert dropped and {(c.spec_id, c.turn) for c in dropped} == early_ends
    assert all(c.stage == "player" for c in dropped)
    # Turn t+1's player was asked before turn t's audits ended.
    order = [tag(r) for r in spec.backend.requests if tag(r)[1] == "e0"]
    if len(a["e0"].turns) > 1:
        assert order.index(("player", "e0", 1, 0)) < order.index(("conflict_check", "e0", 0, 0))


def test_speculative_player_failure_counts_only_when_used(tmp_path: Path) -> None:
    """An invalid speculative answer ends the episode as it would have asked in order; one that was
    never needed (the turn ended by conflict) does not."""
    spec = make_spec()

    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        return "" if stage == "player" and turn == 1 else None  # empty: invalid on every attempt

    seq, spec_run = _both_orders(tmp_path / "used", [spec], None, max_turns=3, rules=rules)
    a, b = seq.run(), spec_run.run()
    assert _results_json(a) == _results_json(b) and a["tiny"].termination == "invalid"
    assert not any(c.speculative for c in spec_run.calls())

    def conflict_at_0(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage == "player" and turn == 1:
            return ""
        if stage in ("conflict_check", "double_check") and turn == 0:
            return conflicts(
                [("fact", "f_0")], **({"confirmed": True, "review_reason": "r"} if stage == "double_check" else {})
            )
        return None

    seq, spec_run = _both_orders(tmp_path / "dropped", [spec], None, max_turns=3, rules=conflict_at_0)
    a, b = seq.run(), spec_run.run()
    assert _results_json(a) == _results_json(b) and a["tiny"].termination == "conflict"
    dropped = [c for c in spec_run.calls() if c.speculative]
    assert len(dropped) == 3 and all(c.stage == "player" and c.turn == 1 and c.error for c in dropped)


def test_an_episode_hands_each_turn_on_at_its_commit_and_its_result_is_made_from_them(tmp_path: Path) -> None:
    """Each commit hands on only its own turn and the episode keeps none: its ending holds the rest (the turn
    a conflict ended it on), and the result made from the handed turns is the result a run writes, where
    the writer reads them back from the turn log, for every ending (conflict, all_resolved, max_turns)."""
    import asyncio

    from helpers import RandomPolicy
    from ncp_local.engines.scripted import ScriptedEngine
    from ncp_local.execution.calls import CallService, RoleBinding, Sampling
    from ncp_local.protocol.episode import Ending, Episode
    from ncp_local.protocol.narrators import BaselineNarrator
    from ncp_local.protocol.player import Player
    from ncp_local.protocol.prompts import PromptPack
    from ncp_local.protocol.records import Checkpoint, EpisodeResult, TurnRecord
    from ncp_local.rundir.store import RunDir

    busy = RandomPolicy(conflict_rate=0.04, node_rate=0.4, satisfy_rate=0.05, add_fact_rate=0.6, negate_fact_rate=0.2)
    specs = [make_spec(f"e{i}", n_nodes=4) for i in range(16)]
    pack = PromptPack.load()
    handed: list[Checkpoint] = []

    async def play(store: RunDir) -> list[EpisodeResult]:
        engine = ScriptedEngine(policy=busy, keep_requests=False)
        roles = {r: RoleBinding(engine, Sampling(), "scripted") for r in ("narrator", "player", "auditor")}
        calls = CallService(roles=roles, pack=pack, store=store)

        async def one(spec: Any) -> EpisodeResult:
            logged: list[TurnRecord] = []

            async def on_commit(cp: Checkpoint) -> None:
                handed.append(cp)
                assert cp.turns_before == len(logged)
                logged.extend(cp.turns)

            episode = Episode(
                spec, BaselineNarrator(pack), Player("adversarial"), calls.ask_for(spec.id), 12, on_commit
            )
            ending = await episode.run()
            assert ending.handed == len(logged) and ending.turns == len(logged) + len(ending.head.turns)
            assert len(ending.head.turns) == (ending.head.termination == "conflict")
            return ending.result(logged)

        return list(await asyncio.gather(*(one(s) for s in specs)))

    store = RunDir(tmp_path / "direct")
    store.open({"test": True}, identity="test")
    try:
        direct = asyncio.run(play(store))
    finally:
        store.close()
    written = Scripted(tmp_path / "run", specs, None, max_turns=12, policy=busy).run()
    assert [r.model_dump_json() for r in direct] == [written[s.id].model_dump_json() for s in specs]
    assert {r.termination for r in direct} == {"conflict", "all_resolved", "max_turns"}
    assert max(len(r.turns) for r in direct) == 12
    assert all(len(cp.turns) == (0 if cp.committed == 0 else 1) for cp in handed)
    with pytest.raises(ValueError, match="expected turns 0 to"):
        Ending(direct[0], 2).result(direct[0].turns[:1])
