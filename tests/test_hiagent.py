"""HiAgent memory on the scripted backend: subgoals, cached summaries, retrieval, trimming, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import Scripted, make_spec, prompt, tag
from ncp_local.engines.base import Request
from ncp_local.protocol.hiagent import HiAgentNarrator, Subgoal
from ncp_local.protocol.ledger import EpisodeState, Exchange, FactUpdate
from ncp_local.protocol.narrators import BaselineNarrator
from ncp_local.protocol.prompts import PromptPack
from ncp_local.rundir.turn_log import read_log


class HiAgentRun(Scripted):
    def __init__(self, *args: Any, budget: int = 4096, **kw: Any) -> None:
        super().__init__(
            *args,
            condition="natural",
            narrator=lambda pack, roles: HiAgentNarrator(pack, roles, budget_tokens=budget),
            **kw,
        )


def _subgoal_rules(plan: dict[int, str], retrieve_at: int | None = None) -> Any:
    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage == "hiagent_narrate":
            retrieve = 0 if turn == retrieve_at and "retrieved in full" not in prompt(req) else None
            return json.dumps({"subgoal": plan[turn], "retrieve": retrieve, "text": f"narration {turn}"})
        return None

    return rules


def test_summaries_computed_once_each_and_shown_instead_of_exchanges(tmp_path: Path) -> None:
    plan = {0: "meet the host", 1: "Meet the host.", 2: "find the key", 3: "find the key", 4: "open the door"}
    run = HiAgentRun(tmp_path, [make_spec()], _subgoal_rules(plan), max_turns=5)
    result = run.run()["tiny"]
    summaries = run.requests("hiagent_summarize")
    # Two subgoals finished (at turns 2 and 4); each summarised exactly once.
    assert [r.tags["turn"] for r in summaries] == [2, 4]
    assert "narration 0" in prompt(summaries[0]) and "narration 1" in prompt(summaries[0])
    assert "narration 2" not in prompt(summaries[0])
    last = prompt(run.requests("hiagent_narrate", turn=4)[0])
    context, memory = last.split("YOUR WORKING MEMORY")
    memory = memory.split("You keep this memory by subgoals")[0]
    assert "[subgoal 0, done] meet the host" in memory and "SUMMARY:" in memory
    assert "narration 0" not in memory  # compressed, not replayed
    assert "narration 3" in memory  # the current subgoal in full
    # Alongside the baseline narrator's turn context, not instead of it: the
    # current node and the narrator's own passages are there too.
    assert "CURRENT STORY BEAT:\n[s_0] node 0 description" in context
    assert "[4] narration 3" in context and "PLAYER:" not in context
    assert result.termination == "max_turns"
    schema = run.requests("hiagent_narrate", turn=4)[0].json_schema
    assert schema["properties"]["retrieve"]["anyOf"][1]["enum"] == [0]  # subgoal 1 is still current


def test_retrieval_expands_a_compressed_subgoal(tmp_path: Path) -> None:
    plan = {0: "a", 1: "b", 2: "b", 3: "b"}
    run = HiAgentRun(tmp_path, [make_spec()], _subgoal_rules(plan, retrieve_at=2), max_turns=4)
    run.run()
    calls = run.requests("hiagent_narrate", turn=2)
    assert len(calls) == 2
    assert "retrieved in full" in prompt(calls[1]) and "narration 0" in prompt(calls[1])
    assert calls[1].json_schema["properties"]["retrieve"] == {"type": "null"}
    assert calls[0].seed != calls[1].seed


def test_memory_trimmed_to_budget_oldest_first() -> None:
    nar = HiAgentNarrator(PromptPack.load(), budget_tokens=60)
    nar.subgoals = [Subgoal(title=f"goal {i}", start=i, end=i + 1, summary="x " * 40) for i in range(3)]
    nar.subgoals.append(Subgoal(title="now", start=3))
    state = EpisodeState(
        facts=(),
        node_occurred=(False,),
        statuses=(),
        pending=FactUpdate(),
        opening="o",
        exchanges=tuple(Exchange(player_input=f"p{i}", response=f"r{i}") for i in range(4)),
    )
    text = nar.memory(state)
    assert "earlier subgoal(s) trimmed" in text and "[subgoal 3, current] now" in text and "r3" in text
    assert "goal 0" not in text
    big = HiAgentNarrator(PromptPack.load(), budget_tokens=10_000)
    big.subgoals = nar.subgoals
    assert "goal 0" in big.memory(state) and "trimmed" not in big.memory(state)


def test_hiagent_state_survives_resume(tmp_path: Path) -> None:
    class Crash(BaseException):
        pass

    plan = {t: f"goal {t // 2}" for t in range(6)}
    full = HiAgentRun(tmp_path / "full", [make_spec()], _subgoal_rules(plan), max_turns=6)
    expected = full.run()["tiny"].model_dump_json()
    n_summaries = len(full.requests("hiagent_summarize"))

    def crash_at_turn_4(req: Request) -> Any:
        if tag(req)[2] == 4 and tag(req)[0] == "player":
            raise Crash()
        return _subgoal_rules(plan)(req)

    first = HiAgentRun(tmp_path / "r", [make_spec()], crash_at_turn_4, max_turns=6)
    try:
        first.run()
    except BaseException:
        pass
    cp = read_log(tmp_path / "r" / "checkpoints" / "tiny.jsonl", None).checkpoint
    assert cp is not None and [s["title"] for s in cp.narrator_state["subgoals"]] == ["goal 0", "goal 1"]
    second = HiAgentRun(tmp_path / "r", [make_spec()], _subgoal_rules(plan), max_turns=6)
    assert second.run()["tiny"].model_dump_json() == expected
    # Summaries made before the crash are not recomputed after it.
    assert len(first.requests("hiagent_summarize")) + len(second.requests("hiagent_summarize")) == n_summaries


def test_baseline_shows_whole_responses(tmp_path: Path) -> None:
    long = "first line\nsecond line of the same response"
    run = Scripted(
        tmp_path, [make_spec()], lambda r: json.dumps({"text": long}) if tag(r)[0] == "narrate" else None, max_turns=2
    )
    run.run()
    assert BaselineNarrator.TEMPLATES == ()
    assert "second line of the same response" in prompt(run.requests("narrate", turn=1)[0])
