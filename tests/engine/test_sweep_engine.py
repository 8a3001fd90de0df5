"""The session's reference sweep (tests/engine/conftest.py `reference_sweep`) on the real vLLM CPU engine
with the embedded model: a batched sweep over the methods (baseline, HiAgent), 2 specs x 1 turn, one
engine start for every point, the speculative player off.

What a point run alone would give is test_mixed_engines': its run (alone, speculative player on, the
auditor on a served copy of the model) must equal the baseline point byte for byte, so a batched sweep
whose neighbours changed a point's results, or a speculative player that changed an episode, fails
there. Content quality is not asserted (a 135M model); form, bookkeeping and reproducibility are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_helpers import CROWDED, FITS, METHODS, ReferenceSweep
from ncp_local.report.runs import load_run
from ncp_local.rundir.call_log import read_calls


def _expected_calls(result: Any) -> int:
    """Successful calls a baseline episode must have logged, from its own record."""
    n = 2  # opening + its fact update
    for t in result.turns:
        n += 4  # player, narrate, fact_update, conflict_check
        n += t.double_check is not None
        if not t.conflicts:
            n += t.trajectory_check is not None
            n += t.status_check is not None
    return n


def test_one_engine_start_serves_every_point(reference_sweep: ReferenceSweep) -> None:
    index = reference_sweep.index
    assert [p["status"] for p in index["points"]] == ["done", "done"]
    assert [f"method={m}" in p["overrides"] for m, p in zip(METHODS, index["points"], strict=True)] == [True, True]
    (engine,) = index["engines"]  # narrator, player and auditor share the embedded model
    assert engine["engine"] == "vllm" and engine["starts"] == 1 and engine["points"] == [0, 1]
    assert reference_sweep.stderr.count("sweep: engine e1 (smollm2-135m-instruct, vllm) started") == 1
    for p in index["points"]:
        manifest = json.loads((Path(p["run_dir"]) / "manifest.json").read_text())
        assert manifest["sweep"]["pid"] == index["pid"] and manifest["sweep"]["engines"]["narrator"]["starts"] == 1


def test_the_baseline_point_logs_every_call_of_its_episodes(reference_sweep: ReferenceSweep) -> None:
    run_dir = reference_sweep.point("baseline")
    run = load_run(run_dir)
    assert set(run.results) == {FITS, CROWDED}
    calls = read_calls(run_dir / "calls.jsonl")
    fits = run.results[FITS]
    assert fits.termination in ("conflict", "max_turns", "all_resolved", "invalid")
    assert "bad JSON" not in fits.reason and "schema" not in fits.reason
    ok = [c for c in calls if c.spec_id == FITS and c.error is None]
    if fits.termination != "invalid":
        assert len(ok) == _expected_calls(fits)
    for c in calls:
        assert not c.speculative, c  # the speculative player is off in this sweep
        if c.spec_id == CROWDED:  # refused before the engine (test_context_limit): no tokens to count
            continue
        for key in (
            "stage",
            "attempt",
            "seed",
            "prompt_tokens",
            "cached_tokens",
            "generated_tokens",
            "latency_s",
            "finish_reason",
        ):
            assert key in c.model_fields_set, (key, c)  # written by the rig, not a default
        assert c.prompt_tokens > 0 and c.generated_tokens > 0
        assert c.error is None or "cut off" in c.error, c
    assert sum((c.cached_tokens or 0) for c in calls) > 0  # prefixes shared between calls are reused


def test_the_hiagent_point_narrates_with_its_memory(reference_sweep: ReferenceSweep) -> None:
    run_dir = reference_sweep.point("hiagent")
    run = load_run(run_dir)
    hi = run.results[FITS]
    assert hi.termination != "invalid", hi.reason
    calls = read_calls(run_dir / "calls.jsonl")
    narrate = [c for c in calls if c.spec_id == FITS and c.stage == "hiagent_narrate" and c.error is None]
    assert hi.turns and len(narrate) >= len(hi.turns)
    assert not [c for c in calls if c.stage == "narrate"]  # the baseline's stage is not used
    assert json.loads((run_dir / "results" / f"{FITS}.json").read_text())["spec_id"] == FITS
