"""A forced window overflow on the real engine: the episode ends `context_limit`,
is censored in S(t), and the report says so.

The baseline point of the session's reference sweep (tests/engine/conftest.py `reference_sweep`) on the
embedded model's own 8192-token window, over two specs: the rig's own red_riding_hood, whose every
call fits, and a copy of treasure_island crowded with 220 more established facts, whose opening prompt
alone (about 11,500 tokens) does not (engine_helpers.reference_dataset). Overflowing by the prompt
itself (not by the output reservation) makes the outcome the same whether or not the backend clamps
max_tokens to the room left. The embedded model's prompts grow only some 30-90 tokens a turn, so a
window that lets turn 0 fit and stops turn 2 would be a few dozen tokens wide: too brittle to pin
here; censoring after committed turns is pinned on scripted runs (tests/test_report.py) and by hand
(tests/test_metrics.py).

The same real run checks the report's cost table against its call log (`check_cost_table`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from cli_runner import run_cli
from engine_helpers import CROWDED, FITS, ReferenceSweep
from ncp_local.protocol.metrics import aggregate, episode_metrics, survival
from ncp_local.report.runs import load_run

MAX_TURNS = 1  # engine_helpers.REFERENCE


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_overflow_ends_context_limit_censored_in_report(reference_sweep: ReferenceSweep, tmp_path: Path) -> None:
    # The sweep's table labels a point's row by its number and what differs: "#0 method=baseline".
    check_forced_run(reference_sweep.stdout, "#0 ", reference_sweep.point("baseline"), tmp_path)


def check_forced_run(stdout: str, row_label: str, out: Path, cwd: Path) -> None:
    lines = stdout.splitlines()
    header = next(line for line in lines if line.startswith("| run |"))
    row = next(line for line in lines if line.startswith(f"| {row_label}"))
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")], strict=True))
    assert cells["context_limit"] == "1", stdout

    # The records: the crowded episode ends context_limit with no turn (the opening overflowed),
    # and the overflow is in the call log, not retried.
    run = load_run(out)
    crowded, fits = run.results[CROWDED], run.results[FITS]
    assert crowded.termination == "context_limit" and crowded.turns == (), crowded
    assert "context_overflow" in crowded.reason and "max_model_len" in crowded.reason
    calls = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    mine = [c for c in calls if c["spec_id"] == CROWDED]
    assert mine and all(c["finish_reason"] == "context_overflow" for c in mine), mine
    assert len(mine) == 1 and mine[0]["stage"] == "opening"
    # The other one fits its window all the way: it ends on its own terms.
    assert fits.termination in ("conflict", "max_turns", "all_resolved"), fits.reason
    assert not [c for c in calls if c["spec_id"] == FITS and c["finish_reason"] == "context_overflow"]
    n = len(fits.turns)
    assert 1 <= n <= MAX_TURNS

    # The estimate: the censored episode is known to run past 0 turns, so it is no ending; the
    # only ending is red_riding_hood's at n turns: S(t) = 1 for t <= n, 0 after. Counting the
    # crowded episode as ended (no censoring) would halve S(1).
    expected = tuple(1.0 if t <= n else 0.0 for t in range(MAX_TURNS + 1))
    agg = aggregate([episode_metrics(r) for r in run.results.values()], MAX_TURNS)
    assert (agg.scored, agg.censored) == (2, 1)
    assert agg.survival == expected
    assert survival([0, n], MAX_TURNS)[1] == 0.5

    rep = run_cli("mode=report", f"runs=[{out}]", "report.resamples=200", f"report.out={cwd / 'report'}", cwd=cwd)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert "1 of 2 scored episode(s) censored (context_limit)" in rep.stdout
    report = cwd / "report"
    [summary] = _csv(report / "results.csv")
    assert (summary["context_limit"], summary["invalid"]) == ("1", "0")
    surv = _csv(report / "survival.csv")
    assert tuple(float(r[run.label]) for r in surv) == expected
    # Censored after t = 1 (its 0 turns, plus the opening under way).
    assert [int(r[f"{run.label} context_limit"]) for r in surv] == [0, 1] + [0] * (MAX_TURNS - 1)
    check_cost_table(_csv(report / "cost.csv"), calls)
    index = (report / "index.html").read_text()
    assert "1 context_limit</div>" in index and f'data-termination="context_limit" data-spec="{CROWDED}"' in index
    page = next((report / "episodes").glob(f"*/{CROWDED}.html")).read_text()
    assert 'class="warn censored"' in page and "context_overflow" in page


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def check_cost_table(rows: list[dict[str, str]], calls: list[dict]) -> None:
    """The report's cost table on this real run is its call log summed by role and stage; the busy time
    it shares out adds up to each engine's busy wall-clock time (tests/test_cost.py has the shares by hand)."""
    run_rows = {(r["role"], r["stage"]): r for r in rows if r["per"] == "run"}
    groups = {(c["role"], c["stage"]) for c in calls}
    assert set(run_rows) == groups | {("all", "all")}
    for group in groups:
        mine = [c for c in calls if (c["role"], c["stage"]) == group]
        row = run_rows[group]
        assert int(row["attempts"]) == len(mine)
        assert int(row["calls"]) == sum(c["attempt"] == 0 for c in mine)
        for key in ("prompt_tokens", "cached_tokens", "generated_tokens"):
            assert int(row[key]) == sum(c.get(key, 0) for c in mine), (group, key)
        assert float(row["engine_s"]) == pytest.approx(sum(c.get("latency_s", 0.0) for c in mine), abs=1e-4)
    total = run_rows[("all", "all")]
    assert int(total["prompt_tokens"]) == sum(c.get("prompt_tokens", 0) for c in calls) > 0
    assert int(total["cached_tokens"]) == sum(c.get("cached_tokens", 0) for c in calls)
    # One model, one engine: its busy time is the union of the calls' time in the engine.
    busy = _union_seconds([(c["done_at"] - c.get("latency_s", 0.0), c["done_at"]) for c in calls])
    assert float(total["busy_s"]) == pytest.approx(busy, abs=1e-3)
    assert 0 < busy <= float(total["engine_s"]) + 1e-3
