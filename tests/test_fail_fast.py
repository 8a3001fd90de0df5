"""A run that fails systematically says so (issue 17): engine-side errors are told apart and stop the run early."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Scripted, make_spec, tag
from ncp_local.engines.base import Completion, ContextOverflow, Request
from ncp_local.execution.calls import SystematicFailure
from ncp_local.exits import EXIT_SYSTEMATIC
from ncp_local.rundir.invalid import Outcome, failure_kind, systematic_invalid

ROOT = Path(__file__).resolve().parent.parent


def _engine_error(stage_name: str) -> Any:
    def rules(req: Request) -> Any:
        stage, *_ = tag(req)
        if stage == stage_name:
            return Completion(text="", finish_reason="error", error="grammar compilation failed: feature X")
        return None

    return rules


def test_engine_error_is_logged_with_the_engines_message_not_bad_json(tmp_path: Path) -> None:
    run = Scripted(tmp_path, [make_spec("a")], _engine_error("trajectory_check"), max_turns=1)
    with pytest.raises(BaseExceptionGroup) as group:
        run.run()
    calls = [c for c in run.calls() if c.stage == "trajectory_check"]
    assert [c.error for c in calls] == ["engine error: grammar compilation failed: feature X"] * 3
    assert isinstance(group.value.exceptions[0], SystematicFailure)  # one episode is all there is


def test_a_stage_failing_the_same_engine_way_everywhere_stops_the_run_early(tmp_path: Path) -> None:
    specs = [make_spec(f"s{i}") for i in range(8)]
    run = Scripted(tmp_path, specs, _engine_error("fact_update"), max_turns=3, concurrency=2)
    with pytest.raises(BaseExceptionGroup) as group:
        run.run()
    failure = group.value.exceptions[0]
    assert isinstance(failure, SystematicFailure) and failure.stage == "fact_update"
    assert "first 3 episodes" in str(failure) and "grammar compilation failed" in str(failure)
    # Stopped early: far fewer than 8 episodes' worth of calls were made.
    assert len({c.spec_id for c in run.calls()}) <= 4


def test_a_stage_that_already_worked_is_not_systematic(tmp_path: Path) -> None:
    def rules(req: Request) -> Any:
        stage, episode, turn, _ = tag(req)
        if stage == "fact_update" and episode != "s0":
            return Completion(text="", finish_reason="error", error="request rejected")
        return None

    results = Scripted(tmp_path, [make_spec(f"s{i}") for i in range(5)], rules, max_turns=1, concurrency=1).run()
    assert results["s0"].termination == "max_turns"
    assert {results[f"s{i}"].termination for i in range(1, 5)} == {"invalid"}


def test_a_model_answering_badly_is_not_an_engine_failure(tmp_path: Path) -> None:
    def rules(req: Request) -> Any:
        return "{not json" if tag(req)[0] == "fact_update" else None

    results = Scripted(tmp_path, [make_spec(f"s{i}") for i in range(4)], rules, max_turns=1).run()
    assert {r.termination for r in results.values()} == {"invalid"}
    assert systematic_invalid((Outcome.of(r) for r in results.values()), 0.5).startswith(
        "4 of 4 episodes are invalid for the same reason: fact_update at the opening"
    )


def test_no_output_room_everywhere_stops_the_run(tmp_path: Path) -> None:
    class NoRoom(Scripted):
        pass

    run = NoRoom(tmp_path, [make_spec(f"s{i}") for i in range(5)], None, max_turns=1)

    async def overflow(request: Request) -> Completion:
        raise ContextOverflow("prompt of 900 tokens leaves 4 for the output; the stage needs 64")

    run.backend.generate = overflow  # type: ignore[method-assign]
    with pytest.raises(BaseExceptionGroup) as group:
        run.run()
    assert isinstance(group.value.exceptions[0], SystematicFailure)
    assert "context_overflow" in str(group.value.exceptions[0])


def test_failure_kinds_and_the_invalid_share() -> None:
    assert failure_kind("engine error: grammar 12 failed") == "engine error: grammar N failed"
    assert failure_kind("bad JSON: Expecting value at char 0") is None
    assert failure_kind("cut off at max_tokens=512") is None
    assert systematic_invalid([], 0.5) is None


def test_the_runs_verdict_reads_the_outcomes_it_kept_not_the_results_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """800 results at turn 100 read back for the verdict took seconds with the interpreter held (the loop
    stalled with it): the scheduler keeps how each episode it ended ended, the same as its result says."""

    def rules(req: Request) -> Any:
        stage, episode, *_ = tag(req)
        return "{not json" if stage == "fact_update" and episode in ("s1", "s2") else None

    results = Scripted(tmp_path, [make_spec(f"s{i}") for i in range(4)], rules, max_turns=2).run()
    read = [Outcome.of(r) for r in results.values()]
    assert [o.termination for o in read] == ["max_turns", "invalid", "invalid", "max_turns"]
    assert read[0].turns == 2 and read[1].turns == 0 and read[1].reason

    def no_reads(episode: str) -> Any:
        raise AssertionError(f"{episode}: read back")

    monkeypatch.setattr(results.store, "load_result", no_reads)
    assert list(results.outcomes()) == read
    assert systematic_invalid(results.outcomes(), 0.4) == systematic_invalid(read, 0.4) is not None


def test_a_systematic_stop_is_one_line_in_a_real_process(tmp_path: Path) -> None:
    """The speculative player call that failed is read before its failure is counted (protocol/episode.py
    Speculation.take): counting it stops the run, and an unread failure was asyncio's traceback ("Task
    exception was never retrieved", on stdout) beside the one line. A real process: it is printed when the
    task is collected, as the interpreter exits."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "engine=scripted", "engine.context_limit_turn=1", "limit=2"]
        + ["max_turns=3", "progress=false", f"out_dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == EXIT_SYSTEMATIC, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stage player"), proc.stderr[-2000:]
