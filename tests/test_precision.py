"""The auditor's error in the figures (report/precision.py): a filled review sheet's precision per
conflict type, the conflict rates and S(t) corrected for it, and the sheets refused."""

from __future__ import annotations

import csv
import io
import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cli_runner import run_cli
from ncp_local.protocol.metrics import km_survival, product_limit
from ncp_local.report import build_report, load_runs
from ncp_local.report.precision import UNCORRECTED_NOTE, Verdict, correct, precisions
from ncp_local.report.review import SHEET_COLUMNS, sample_conflicts, sheet_csv
from ncp_local.report.runs import attach_specs


def test_product_limit_is_kaplan_meier_and_matches_lifelines() -> None:
    turns = np.array([1, 2, 2, 2, 3, 4, 4, 5, 5, 5])
    censored = np.array([False, False, True, False, False, False, True, False, False, False])
    # Every ending whole: the report's own Kaplan-Meier (scipy).
    whole = product_limit(turns, np.where(censored, 0.0, 1.0), 5)
    assert whole == pytest.approx(km_survival(turns.tolist(), censored.tolist(), 5).s, abs=1e-12)
    # Fractional endings: lifelines' weighted Kaplan-Meier on the split records (an ending of weight w, and a
    # story still going of weight 1 - w, censored half a turn on so that it is at risk for its own turn).
    from lifelines import KaplanMeierFitter

    w = np.where(censored, 0.0, np.linspace(0.3, 1.0, len(turns)))
    times = np.concatenate([turns, turns + 0.5])
    events = np.concatenate([np.ones(len(turns)), np.zeros(len(turns))])
    weights = np.concatenate([w, 1 - w])
    keep = weights > 0
    with pytest.warns(Warning):  # lifelines notes that the weights are not whole numbers
        km = KaplanMeierFitter().fit(times[keep], events[keep], weights=weights[keep])
    theirs = [float(km.survival_function_at_times(t - 0.5).iloc[0]) for t in range(1, 6)]
    assert product_limit(turns, w, 5)[1:] == pytest.approx(theirs, abs=1e-12)


def _runs(run_dir: Path) -> list:
    runs = load_runs([str(run_dir)])
    for r in runs:
        attach_specs(r)
    return runs


def _sheet(runs: list, tmp_path: Path, fill: dict[str, list[str]]) -> tuple[Path, list[dict[str, str]]]:
    """Every conflict of the run on a sheet; the first rows of each type get the verdicts in `fill`."""
    rows = sample_conflicts(runs, 1000, seed=0)
    given = {t: list(v) for t, v in fill.items()}
    for r in rows:
        if given.get(r["type"]):
            r["verdict"] = given[r["type"]].pop(0)
    path = tmp_path / "review_filled.csv"
    path.write_text(sheet_csv(rows), encoding="utf-8")
    return path, rows


def test_two_of_ten_fact_conflicts_disputed_correct_the_fact_rate_and_survival(
    scripted_official_run: Path, tmp_path: Path
) -> None:
    runs = _runs(scripted_official_run)
    sheet, rows = _sheet(runs, tmp_path, {"fact": ["agree"] * 4 + ["dispute"] + ["agree"] * 4 + ["dispute"]})
    out = tmp_path / "report"
    rep = build_report(runs, out, resamples=400, seed=0, review_sheet=sheet)
    err = rep["auditor_error"]
    fact = err.precision["fact"]
    assert (fact.reviewed, fact.upheld) == (10, 8)
    # Clopper-Pearson for 8 of 10 at 95%, from the beta quantiles: [0.44390, 0.97479].
    assert (round(fact.lo, 5), round(fact.hi, 5)) == (0.4439, 0.97479)
    (c,) = err.corrected
    ms = runs[0].metrics()
    judged = 100 * sum(m.fact for m in ms) / len(ms)
    as_judged, corrected = c.rates["fact_pct"]
    # Each scripted conflict turn holds one conflict: the corrected rate is the judged one times the precision,
    # upheld / reviewed (unbiased; not the draws' median, 0.787 for Beta(8.5, 2.5)).
    assert as_judged == pytest.approx(judged) and corrected.point == pytest.approx(judged * 0.8)
    assert corrected.lo < corrected.point < corrected.hi
    assert c.rates["commitment_pct"][1].point == pytest.approx(c.rates["commitment_pct"][0])
    assert c.uncorrected_types == ("commitment", "player_input")
    # S(t) by hand: a fact ending counts 0.8 as an ending and 0.2 as a story still going after its turn.
    judged_s, corr_s, lo_s, hi_s = c.survival
    s, expected = 1.0, [1.0]
    for t in range(1, 16):
        n = t - 1
        at_risk = sum(m.turns >= n for m in ms)
        ended = sum(
            (0.8 if m.fact else 1.0)
            for m in ms
            if m.turns == n and m.termination in ("conflict", "all_resolved", "max_turns")
        )
        s *= (1 - ended / at_risk) if at_risk else 1.0
        expected.append(s)
    # The point is the product-limit estimate by hand, with draws or without (resamples=0).
    plug_in = correct(runs[0], err.precision, [], 0, 0, 0.95)
    assert plug_in.survival[1] == pytest.approx(expected, abs=1e-12) == corr_s
    assert plug_in.rates["fact_pct"][1].point == pytest.approx(judged * 0.8)
    assert judged_s == pytest.approx(runs[0].aggregate().survival, abs=1e-12)
    assert all(a >= b - 1e-12 for a, b in zip(corr_s, judged_s, strict=True)) and corr_s[15] > judged_s[15]
    assert all(a >= b for a, b in itertools.pairwise(corr_s))
    assert all(lo <= x + 1e-12 and x <= hi + 1e-12 for x, lo, hi in zip(corr_s, lo_s, hi_s, strict=True))
    md = (out / "results.md").read_text()
    assert "## The auditor's error" in md and "10 reviewed conflict(s)" in md and "80.0 [44.4, 97.5]" in md
    assert f"| fact % | {judged:.1f} | {corrected.point:.1f} [{corrected.lo:.1f}, {corrected.hi:.1f}] |" in md
    table = list(csv.DictReader(io.StringIO((out / "survival_corrected.csv").read_text())))
    assert len(table) == 16 and float(table[15]["survival_corrected"]) == pytest.approx(corr_s[15], abs=1e-8)


def test_without_a_sheet_the_report_says_it_is_uncorrected(scripted_official_run: Path, tmp_path: Path) -> None:
    rep = build_report(_runs(scripted_official_run), tmp_path / "report", resamples=50, html=False)
    assert rep["auditor_error"] is None and rep["auditor_md"] == UNCORRECTED_NOTE
    assert not (tmp_path / "report" / "survival_corrected.csv").exists()


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=SHEET_COLUMNS, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


@pytest.mark.parametrize("case", ["unknown episode", "duplicate", "bad verdict", "another run", "not a conflict"])
def test_a_bad_sheet_is_one_line_naming_file_and_row_and_writes_nothing(
    scripted_official_run: Path, tmp_path: Path, case: str
) -> None:
    runs = _runs(scripted_official_run)
    rows = [{k: str(v) for k, v in r.items() if not k.startswith("_")} for r in sample_conflicts(runs, 5, seed=1)]
    for r in rows:
        r["verdict"] = "agree"
    field = {
        "unknown episode": "spec_id",
        "duplicate": "",
        "bad verdict": "verdict",
        "another run": "run_dir",
        "not a conflict": "target_id",
    }[case]
    if case == "unknown episode":
        rows[2]["spec_id"] = "no_such_story"
    elif case == "duplicate":
        rows.insert(3, dict(rows[1]))
    elif case == "bad verdict":
        rows[2]["verdict"] = "maybe"
    elif case == "another run":
        rows[2]["run_dir"] = str(tmp_path / "elsewhere")
    else:
        rows[2]["target_id"] = "f_999"
    sheet = _write(tmp_path / "sheet.csv", rows)
    out = tmp_path / "report"
    done = run_cli(
        "mode=report",
        f"runs=[{scripted_official_run}]",
        f"review.sheet={sheet}",
        f"report.out={out}",
        "report.html=false",
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    row = "row 5" if case == "duplicate" else "row 4"
    assert len(lines) == 1 and str(sheet) in lines[0] and row in lines[0] and field in lines[0], lines
    if case == "duplicate":
        assert "row 3" in lines[0]
    assert not out.exists()


def _toy_run(n: int, fact_every: int) -> SimpleNamespace:
    """n single-play stories of 5 turns; every `fact_every`-th ends in one fact conflict, the rest resolved."""
    results = {}
    for i in range(n):
        fact = i % fact_every == 0
        last = SimpleNamespace(conflicts=[SimpleNamespace(type="fact", target_id="f0")] if fact else [])
        results[f"s{i}"] = SimpleNamespace(
            spec_id=f"s{i}",
            trial=0,
            termination="conflict" if fact else "all_resolved",
            turns=[SimpleNamespace(conflicts=[])] * 4 + [last],
        )
    return SimpleNamespace(results=results, label="toy", max_turns=6, path=Path("/toy"))


def test_a_small_sheet_puts_the_point_inside_its_interval_and_keeps_the_precisions_uncertainty() -> None:
    # 0 of 3 fact conflicts upheld. The point is the unbiased one, a precision of 0: a fact rate of 0. Every
    # precision drawn from Beta(1/2, 7/2) is above 0, so the draws' band alone would lie above the point; it is
    # widened to take it in, and keeps the precision's spread above (0/3 in every draw would give [0, 0]).
    run = _toy_run(40, 2)
    verdicts = [Verdict("/toy", f"s{i}", "fact", "f0", False) for i in (0, 2, 4)]
    c = correct(run, precisions(verdicts, 0.95), verdicts, 400, 0, 0.95)
    rate = c.rates["fact_pct"][1]
    assert rate.point == rate.lo == 0.0
    # Beta(1/2, 7/2): 97.5% quantile 0.53; half of the 40 stories end by fact.
    assert rate.hi > 50 * 0.4
    # 3 of 3 upheld: the point is the judged rate (a precision of 1), the interval reaching well below it.
    upheld = [Verdict("/toy", f"s{i}", "fact", "f0", True) for i in (0, 2, 4)]
    c = correct(run, precisions(upheld, 0.95), upheld, 400, 0, 0.95)
    rate = c.rates["fact_pct"][1]
    assert rate.point == pytest.approx(50.0) == c.rates["fact_pct"][0]
    assert rate.lo < 50 * 0.75 and rate.lo <= rate.point <= rate.hi
