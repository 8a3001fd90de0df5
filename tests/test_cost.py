"""The cost table: sums over the call log by role and stage, busy time shared among calls in flight, a price."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from omegaconf import OmegaConf

from ncp_local.config import compose
from ncp_local.execution.preflight import plan_growth
from ncp_local.report import build_report
from ncp_local.report.cost import busy_shares, cost_table, plan_projection
from ncp_local.report.runs import load_run
from ncp_local.rundir.call_log import CallLine, read_calls
from test_report import make_run, write_dataset


def _call(role: str, stage: str, start: float, end: float, attempt: int = 0, model: str = "m") -> CallLine:
    return CallLine(
        spec_id="a",
        turn=0,
        role=role,
        stage=stage,
        model=model,
        attempt=attempt,
        seed=attempt,
        prompt_tokens=100,
        cached_tokens=40,
        generated_tokens=10,
        latency_s=end - start,
        done_at=end,
    )


def test_busy_time_is_shared_among_calls_in_flight() -> None:
    # narrate alone 0-2; narrate and fact_update together 2-4 (1 s each); fact_update alone 4-5;
    # nothing 5-7; status alone 7-8. Busy 6 s of the 8; the summed latencies are 8.
    calls = [
        _call("narrator", "narrate", 0, 4),
        _call("auditor", "fact_update", 2, 5),
        _call("auditor", "status_check", 7, 8),
    ]
    shares = busy_shares(calls, lambda c: c.stage)
    assert shares == {"narrate": 3.0, "fact_update": 2.0, "status_check": 1.0}
    # A call ending as another starts is not in flight with it.
    assert busy_shares([_call("a", "x", 0, 1), _call("a", "y", 1, 2)], lambda c: c.stage) == {"x": 1.0, "y": 1.0}
    # An older log (no done_at): unknown, not guessed.
    assert busy_shares([calls[0].model_copy(update={"done_at": None})], lambda c: c.stage) is None


def test_cost_table_sums_and_prices(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run", write_dataset(tmp_path / "dataset"), ids=["a"])
    # Replace the scripted log by one whose every figure is known: two models (engines), a retry.
    calls = [
        _call("narrator", "narrate", 0, 4),
        _call("auditor", "fact_update", 2, 5, model="aud"),
        _call("auditor", "fact_update", 5, 6, attempt=1, model="aud"),
        _call("narrator", "narrate", 3, 4),
    ]
    (run_dir / "calls.jsonl").write_text("".join(c.to_line() + "\n" for c in calls))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["config"]["auditor"]["model"]["tensor_parallel_size"] = 2
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    run = load_run(run_dir)
    t = cost_table(run, gpu_hour_cost=3.6)
    narrate, fact = t.rows[("narrator", "narrate")], t.rows[("auditor", "fact_update")]
    assert (fact.calls, fact.attempts, fact.prompt_tokens, fact.cached_tokens, fact.generated_tokens) == (
        1,
        2,
        200,
        80,
        20,
    )
    assert (narrate.calls, narrate.attempts) == (2, 2)
    assert math.isclose(narrate.engine_s, 5.0) and math.isclose(fact.engine_s, 4.0)
    # Each model is its own engine: narrate busy 0-4 (two calls overlap 3-4), fact_update 2-6.
    assert math.isclose(narrate.busy_s or 0, 4.0) and math.isclose(fact.busy_s or 0, 4.0)
    assert math.isclose(t.costs[("narrator", "narrate")] or 0, 4 / 3600 * 1 * 3.6)
    assert math.isclose(t.costs[("auditor", "fact_update")] or 0, 4 / 3600 * 2 * 3.6)  # two GPUs
    assert t.episode_turns == len(run.results["a"].turns) == 2

    out = tmp_path / "report"
    rep = build_report([run], out, resamples=50, gpu_hour_cost=3.6)
    rows = list(csv.DictReader(io.StringIO((out / "cost.csv").read_text())))
    total = next(r for r in rows if r["per"] == "run" and r["stage"] == "all")
    assert (total["calls"], total["attempts"], total["prompt_tokens"]) == ("3", "4", "400")
    assert float(total["cache_hit_pct"]) == 40.0 and math.isclose(
        float(total["cost"]), (4 + 8) / 3600 * 3.6, rel_tol=1e-5
    )
    per_turn = next(r for r in rows if r["per"] == "episode-turn" and r["stage"] == "all")
    assert float(per_turn["prompt_tokens"]) == 200.0 and float(per_turn["attempts"]) == 2.0
    assert "| run | all | all | 3 | 4 | 400 | 160 | 40 | 40.0 | 9.0 | 8.0 | 0.0120 |" in rep["cost_md"]
    index = (out / "index.html").read_text()
    assert "Cost by role and stage" in index and 'title="cached tokens as a share of prompt tokens"' in index

    # Without a price there is no cost column; a log without done_at has no busy time.
    # An older rig's log: no `done_at`.
    older = [c.model_dump(exclude={"done_at"}) for c in calls]
    (run_dir / "calls.jsonl").write_text("".join(json.dumps(c) + "\n" for c in older))
    t = cost_table(load_run(run_dir), gpu_hour_cost=3.6)
    assert t.total.busy_s is None and t.total_cost is None
    md = build_report([load_run(run_dir)], tmp_path / "r2", resamples=50)["cost_md"]
    assert "| cost |" not in md and "n/a" in md


def test_plan_projection_beside_the_measured_tokens(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "dataset")
    run_dir = make_run(tmp_path / "run", dataset, ids=["a", "c"])
    manifest_path = run_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    # A scripted run is not projected, and says why.
    manifest["config"]["engine"] = {"name": "scripted"}
    manifest_path.write_text(json.dumps(manifest))
    t = cost_table(load_run(run_dir), plan=plan_growth)
    assert t.projected is None and "scripted" in t.projection_note
    # The same calls under the default (embedded-model) config as a run records it: projected per stage.
    manifest["config"] = OmegaConf.to_container(compose(["max_turns=4"]), resolve=True)
    manifest_path.write_text(json.dumps(manifest))
    run = load_run(run_dir)
    projected, source = plan_projection(run, plan_growth)
    assert projected is not None and "played" in source
    calls = read_calls(run_dir / "calls.jsonl")
    assert set(projected) == {(c.role, c.stage) for c in calls}
    # Each call is read off the plan's growth at its own turn: the two openings at one size, and a
    # narration prompt (which holds the story so far) above an opening's.
    openings = [c for c in calls if c.stage == "opening"]
    assert len(openings) == 2
    narrate = [c for c in calls if c.stage == "narrate"]
    assert projected[("narrator", "narrate")] / len(narrate) > projected[("narrator", "opening")] / 2 > 0

    out = tmp_path / "report"
    md = build_report([run], out, resamples=20, plan=plan_growth)["cost_md"]
    assert "| plan prompt tok |" in md and f"plan: {source}" in md
    rows = list(csv.DictReader(io.StringIO((out / "cost.csv").read_text())))
    total = next(r for r in rows if r["per"] == "run" and r["stage"] == "all")
    assert abs(float(total["plan_prompt_tokens"]) - sum(projected.values())) <= 1
    assert total["prompt_tokens"] == str(sum(c.prompt_tokens for c in calls))  # measured, beside it


def test_shards_are_timed_apart(tmp_path: Path) -> None:
    # Two shards of one run, each its own process and engine, working at the same time: busy 4 s each.
    dataset = write_dataset(tmp_path / "dataset")
    root = tmp_path / "sharded"
    for i, sid in enumerate(("a", "c")):
        part = make_run(root / f"shard-00{i}-of-002", dataset, [sid])
        (part / "calls.jsonl").write_text(_call("narrator", "narrate", 0, 4).to_line() + "\n")
    t = cost_table(load_run(root))
    narrate = t.rows[("narrator", "narrate")]
    assert (narrate.attempts, narrate.engine_s, narrate.busy_s) == (2, 8.0, 8.0)
