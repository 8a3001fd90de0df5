"""Comparisons (issue 58): paired differences by story, the sign-flip test's size and power, Holm, the
comparisons section of mode=compare and mode=report, and the paper's figures beside a run."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cli_runner import ROOT, run_cli
from ncp_local.protocol.metrics import OVERRULED, EpisodeMetrics, product_limit
from ncp_local.report.compare import Comparison, compare_runs
from ncp_local.report.compare_doc import (
    MDD_RULE,
    comparison_rows,
    comparisons_csv,
    comparisons_markdown,
    comparisons_note,
    sentence,
    verdict,
)
from ncp_local.report.labels import short_names
from ncp_local.report.paired import MEANS, Difference, Pool, holm, measurer, paired_differences, sign_flip_p
from ncp_local.report.paper import matching_rows, paper, row_named
from ncp_local.report.runs import load_run


def _ep(sid: str, turns: int, termination: str = "conflict", trial: int = 0, kind: int = 0) -> EpisodeMetrics:
    conflict = termination == "conflict"
    return EpisodeMetrics(
        sid, termination, turns, 0.2, 0.3, conflict and kind == 0, conflict and kind == 1, conflict and kind == 2,
        trial=trial,
    )  # fmt: skip


def test_holm_by_hand() -> None:
    # Sorted 0.01, 0.02, 0.04: times 3, 2, 1 -> 0.03, 0.04, 0.04 (kept non-decreasing).
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    out = holm([math.nan, 0.01])
    assert math.isnan(out[0]) and out[1] == pytest.approx(0.01)


def test_sign_flip_p_is_exact_with_few_stories() -> None:
    """Three stories, one play each, B lasting 1, 2 and 3 turns longer: the 8 sign patterns give mean
    differences (+-1 +-2 +-3) / 3; only +6/3 and -6/3 are as far from 0 as the observed 2, so p = 2/8."""
    a = [[_ep(f"s{i}", 2)] for i in range(3)]
    b = [[_ep(f"s{i}", 2 + i + 1)] for i in range(3)]
    pool = Pool([a, b])
    measure = measurer(pool, 8, [4], True)
    p = sign_flip_p(measure, pool, 2000, np.random.default_rng(0))
    assert p[0] == pytest.approx(2 / 8)  # avg turns
    assert p[7] == pytest.approx(2 / 8)  # turns kept (no censoring: the same as avg turns)


def test_paired_interval_beats_unpaired_when_stories_differ() -> None:
    """Stories that differ a lot (2 to 38 turns) and a run that keeps each 1 turn longer: the paired interval
    sits on +1, the unpaired one spans the stories' spread; the test finds the difference."""
    a = [[_ep(f"s{i}", 2 + i)] for i in range(0, 37, 2)]
    b = [[_ep(f"s{i}", 3 + i)] for i in range(0, 37, 2)]
    rows = {d.figure.key: d for d in paired_differences(Pool([a, b]), 40, [10, 20], True, 400, 0, 0.95)}
    kept = rows["turns_kept"]
    assert kept.diff == pytest.approx(1.0) and kept.lo == pytest.approx(1.0) and kept.hi == pytest.approx(1.0)
    assert kept.unpaired_hi - kept.unpaired_lo > 10
    assert kept.p < 0.01
    assert rows["avg_turns"].diff == pytest.approx(1.0)


def test_a_storys_plays_move_together_in_both_runs() -> None:
    """Two plays a story in each run, run B = run A: every difference is 0 and no resample moves it."""
    a = [[_ep(f"s{i}", 1 + i % 5, trial=k, kind=i % 3) for k in range(2)] for i in range(12)]
    rows = paired_differences(Pool([a, a]), 6, [3], True, 200, 0, 0.95)
    for d in rows:
        assert d.diff == 0 and d.lo == d.hi == 0 and d.p == 1.0, d.figure.key


# ---- the test's size and power on simulated paired runs ---------------------------------------------


def _play(rng: np.random.Generator, sid: str, hazard: float, cap: int, trial: int) -> EpisodeMetrics:
    """Turn by turn: a 2% chance the window is full (censored), else a conflict with chance `hazard`."""
    for t in range(1, cap + 1):
        if rng.random() < 0.02:
            return _ep(sid, t - 1, "context_limit", trial)
        if rng.random() < hazard:
            return _ep(sid, t, "conflict", trial, int(rng.integers(3)))
    return _ep(sid, cap, "max_turns", trial)


def _simulated_pool(rng: np.random.Generator, stories: int, plays: int, ratio: float, cap: int = 20) -> Pool:
    """Stories of varied difficulty (a log-normal frailty), run B's hazard `ratio` times run A's."""
    frail = rng.lognormal(0, 0.6, size=stories)
    sides = [
        [[_play(rng, f"s{i}", min(0.9, 0.08 * frail[i] * r), cap, k) for k in range(plays)] for i in range(stories)]
        for r in (1.0, ratio)
    ]
    return Pool(sides)


def _rejections(ratio: float, sims: int, seed: int) -> float:
    """Share of simulated pairs whose turns kept the sign-flip test rejects at 5% (99 sign patterns each)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        pool = _simulated_pool(rng, 30, 2, ratio)

        def kept(idx: np.ndarray, pool: Pool = pool) -> np.ndarray:
            return np.asarray([product_limit(pool.turns[idx], pool.ended[idx], 20)[1:].sum()])

        hits += int(sign_flip_p(kept, pool, 99, rng)[0] <= 0.05)
    return hits / sims


def test_sign_flip_size_is_about_five_percent_under_no_difference() -> None:
    """No difference: rejections at 5% in 200 simulated pairs (30 stories x 2 plays, 2% censoring a turn).
    With 99 sign patterns a p-value is a multiple of 0.01; the size is 5% within about 3 Monte Carlo errors
    (1.5% each)."""
    assert 0.01 <= _rejections(1.0, 200, 58) <= 0.10


def test_sign_flip_power_at_a_known_difference() -> None:
    """Run B's conflict hazard at 0.4 times A's (+4.4 turns kept on a baseline of 10.0 of 20, from 4000
    simulated stories): found about 9 times in 10; docs/measurements/2026-12-05-comparisons.md has the table."""
    assert _rejections(0.4, 60, 7) >= 0.75


# ---- mode=compare and mode=report on scripted runs ---------------------------------------------------


def _scripted(out: Path, *extra: str) -> Path:
    done = run_cli("engine=scripted", "max_turns=6", f"out_dir={out}", "progress=false", *extra)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("compare")
    return _scripted(root / "a", "trials.count=2"), _scripted(root / "b", "trials.count=2", "seed=1")


def test_mode_compare_of_two_scripted_runs(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_runs
    out = tmp_path / "cmp"
    done = run_cli("mode=compare", f"runs=[{a},{b}]", f"report.out={out}", "report.resamples=300", "progress=false")
    assert done.returncode == 0, done.stderr
    text = (out / "compare.md").read_text()
    assert "## Comparisons" in text and "seed=1 vs the baseline" in done.stdout
    # What ran, per run, once: its short name, folder, engine and models (a scripted run says no model ran),
    # its full label where the name is short.
    assert f"- baseline: {a}; engine scripted, no model (every role); seed=0\n" in done.stdout
    assert f"- seed=1: {b}; engine scripted, no model (every role)\n" in done.stdout
    assert "Scripted engine: no model ran" in done.stdout and "Scripted engine: no model ran" in text
    assert "  - with 3 stories no p-value can fall below 0.25" in done.stdout
    rows = list(csv.DictReader((out / "compare.csv").open()))
    by = {r["figure"]: r for r in rows}
    assert {"avg_turns", "turns_kept", "S(6)", "fact_at_h", "all_resolved_at_h"} <= set(by)
    # The difference is B's value minus A's; p on the exact 8 sign patterns.
    for r in rows:
        assert float(r["difference"]) == pytest.approx(float(r["run_value"]) - float(r["baseline_value"]), abs=1e-5)
        assert float(r["p"]) >= 0.25 - 1e-9  # 3 stories: 2 / 2^3 is the floor
        assert r["stories"] == "3" and r["horizon"] == "6"
    # One plain sentence per figure.
    assert text.count("- turns kept: ") == 1 and text.count("- avg turns: ") == 1


def test_a_run_against_itself_is_refused_and_a_torn_result_is_named(
    two_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    # A run given twice, or a copy of it, is refused in one line (exit 2): its differences are nothing.
    a, b = two_runs
    copy = tmp_path / "again"
    shutil.copytree(a, copy)
    for pair in (f"[{a},{a}]", f"[{a},{copy}]"):
        done = run_cli("mode=compare", f"runs={pair}", f"report.out={tmp_path / 'o'}", "progress=false")
        assert done.returncode == 2 and "it is the same run" in done.stderr, done.stderr
    # A result file cut short in a compared run is named with its reason, as mode=report names it, not passed
    # off as a story the run never played.
    torn = tmp_path / "torn"
    shutil.copytree(b, torn)
    victim = sorted((torn / "results").glob("*.json"))[0]
    victim.write_bytes(victim.read_bytes()[:40])
    done = run_cli(
        "mode=compare", f"runs=[{a},{torn}]", f"report.out={tmp_path / 't'}", "report.resamples=50", "progress=false"
    )
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if str(victim) in x]
    assert line.endswith("not counted") and "stories played by only one" not in done.stdout


def test_mode_report_holds_the_comparisons_section(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_runs
    out = tmp_path / "rep"
    done = run_cli(
        "mode=report", f"runs=[{a},{b}]", f"report.out={out}", "report.resamples=100", "progress=false",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = (out / "results.md").read_text()
    assert "## Comparisons" in text and "turns kept" in text
    assert (out / "compare.csv").is_file()
    html = (out / "index.html").read_text()
    assert "<h2>Comparisons</h2>" in html and "seed=1 vs the baseline" in html
    alone = run_cli("mode=report", f"runs=[{a}]", f"report.out={tmp_path / 'one'}", "report.html=false")
    assert alone.returncode == 0 and "## Comparisons" not in (tmp_path / "one" / "results.md").read_text()


def test_different_turn_caps_compare_the_curves_only(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = two_runs
    short = _scripted(tmp_path / "short", "trials.count=2", "max_turns=4")
    done = run_cli("mode=compare", f"runs=[{a},{short}]", f"report.out={tmp_path / 'o'}", "report.resamples=50")
    assert done.returncode == 0, done.stderr
    assert "turn caps differ (6 vs 4): only the curves' figures to turn 4 are compared" in done.stdout
    figures = {r["figure"] for r in csv.DictReader((tmp_path / "o" / "compare.csv").open())}
    assert "avg_turns" not in figures and "turns_kept" in figures and "S(4)" in figures


# ---- the paper beside a run ---------------------------------------------------------------------------


def test_the_paper_file_ships_every_table_with_its_setup() -> None:
    p = paper()
    assert p.design["stories"] == 100 and p.design["plays"] == 1 and p.design["max_turns"] == 100
    assert {r.table for r in p.rows.values()} == {"Table 1", "Table 2", "Table 3", "Table 4"}
    assert row_named("table1/GPT-5.2").figures["S(20)"] == 42.0
    assert row_named("table3/HiAgent").setup["method"] == "hiagent"
    for r in p.rows.values():
        assert set(r.setup) == {"narrator", "player", "auditor", "method", "input"}


def test_compare_paper_beside_a_scripted_run(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = two_runs
    done = run_cli("mode=compare", f"runs=[{a}]", "compare.paper=table1/GPT-4o-mini", f"report.out={tmp_path}")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "beside the paper's Table 1, row GPT-4o-mini" in out and "compare.paper=table1/GPT-4o-mini" in out
    assert "measures nothing" in out
    # What ran, from the manifest: a scripted run lists no model as if it ran.
    assert "What ran: engine scripted, no model (every role)." in out and "smollm2" not in out
    for line in (
        "engine: scripted",
        "narrator: scripted, no model (paper: GPT-4o-mini)",
        "player: scripted, no model (paper: Gemini-2.5-Flash)",
        "auditor: scripted, no model (paper: Gemini-2.5-Flash)",
        "turn cap: 6 (paper: 100)",
        "stories x plays: 3 x 2 (paper: 100 x 1)",
        "context window: 8192 tokens, 0% of episodes censored",
        "dataset: local with 3 specs",
    ):
        assert line in out, line
    # Turn-cap figures are shown, not set against the paper's.
    assert "not compared: turn cap 6 vs the paper's 100" in out


def test_a_run_matches_the_rows_of_its_narrator_method_and_input(two_runs: tuple[Path, Path]) -> None:
    run = load_run(two_runs[0])
    assert matching_rows(run) == []
    cfg = run.manifest["config"]
    cfg["narrator"]["model"]["name"] = "Kimi-K2.5"
    assert matching_rows(run) == []  # a scripted run ran no narrator, whatever its config names
    run.manifest.pop("models", None)
    cfg["engine"]["name"] = "openai"
    assert [r.id for r in matching_rows(run)] == ["table1/Kimi-K2.5"]
    cfg["condition"]["name"] = "natural"
    assert matching_rows(run) == []


def test_the_paper_interval_counts_the_papers_own_error(tmp_path: Path) -> None:
    """A run of 100 stories at the paper's cap: the interval for a share is d +- z sqrt(se_run^2 + se_paper^2),
    se_paper^2 = p (1 - p) / 100; the run's own se alone would be narrower."""
    from ncp_local.report import paper as paper_mod
    from ncp_local.report.runs import Run

    rng = np.random.default_rng(3)
    results = {}
    run = Run(tmp_path, "sim", {"config": {"max_turns": 100, "engine": {"name": "scripted"}}}, results)
    eps = [_play(rng, f"s{i}", 0.05, 100, 0) for i in range(100)]
    run.metrics = lambda: eps  # type: ignore[method-assign]
    run._aggregates = {}
    b = paper_mod.beside_paper(run, row_named("table1/GPT-4o-mini"), "test", 0.95, 400, 0)
    fact = next(ln for ln in b.lines if ln.key == "fact_pct")
    mine = 100 * sum(m.fact for m in eps) / 100
    assert fact.run == pytest.approx(mine) and fact.diff == pytest.approx(mine - 64.0)
    half = (fact.hi - fact.lo) / 2
    paper_se = 100 * math.sqrt(0.64 * 0.36 / 100)
    assert half > 1.959 * paper_se  # the paper's error alone is 9.4 points wide each side
    assert half < 1.96 * math.sqrt(paper_se**2 + 10.0**2)


def test_a_reaudit_compares_the_auditors_on_the_same_transcripts(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    """A scripted re-audit judges as the run's own scripted auditor did: every difference is 0, and the
    section says the difference is the auditors' alone (the paper's Table 2 question)."""
    a, _ = two_runs
    ra = tmp_path / "ra"
    done = run_cli("mode=reaudit", f"runs=[{a}]", "engine=scripted", f"out_dir={ra}", "progress=false")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "o"
    done = run_cli("mode=compare", f"runs=[{a},{ra}]", f"report.out={out}", "report.resamples=50", "progress=false")
    assert done.returncode == 0, done.stderr
    assert "a re-audit of the baseline's transcripts: the differences are the auditors' alone" in done.stdout
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert rows and all(float(r["difference"]) == 0 for r in rows)


# ---- censoring that differs between the runs ------------------------------------------------------------


def _fake_run(label: str, plays: list[EpisodeMetrics], cap: int = 12) -> SimpleNamespace:
    return SimpleNamespace(
        label=label,
        path=Path(f"/{label}"),
        max_turns=cap,
        manifest={},
        damaged=(),
        in_flight=(),
        overrides="",
        metrics=lambda: plays,
    )


def test_a_run_its_window_stopped_more_gets_no_verdict_on_the_as_played_figures() -> None:
    # The same plays in both runs, except that the window stopped a third of b's one turn before their end:
    # avg turns and the rates differ by that alone, so they get no verdict (the reason in their sentence, no
    # p in the table, left out of Holm's family); turns kept, S(t) and the endings by t keep theirs and lead.
    base = [_ep(f"s{i}", 2 + i % 9, kind=i % 3) for i in range(30)]
    cut = [_ep(m.spec_id, m.turns - 1, "context_limit") if i % 3 == 0 else m for i, m in enumerate(base)]
    a, b, c = _fake_run("a", base), _fake_run("b", cut), _fake_run("c", base)
    cs = compare_runs([a, b, c], resamples=200)
    against_b, against_c = cs.compared
    assert against_b.window == (0.0, pytest.approx(1 / 3)) and against_c.window == (0.0, 0.0)
    keys = [d.figure.key for d in against_b.rows]
    assert keys[0] == "turns_kept" and keys.index("fact_at_h") < keys.index("avg_turns")
    for d in against_b.rows:
        said = sentence(against_b, d, 0.95)
        if d.figure.key in {k for k, _ in MEANS}:
            assert d.withheld and math.isnan(d.p_holm) and "stopped 33.3% of b's plays and 0.0% of baseline's" in said
        else:
            assert not d.withheld and "paired interval" in said and not math.isnan(d.p_holm)
    assert not any(d.withheld for d in against_c.rows)
    # Holm over the one run left in the family is the raw p: c's avg turns is alone there.
    avg_c = next(d for d in against_c.rows if d.figure.key == "avg_turns")
    assert avg_c.p_holm == avg_c.p
    md = comparisons_markdown(cs)
    assert "stopped by the window: baseline 0.0%, b 33.3%" in md
    rows = comparison_rows(against_b)
    assert rows[keys.index("avg_turns")][6] == "no verdict" and rows[0][6] != "no verdict"
    assert "no_verdict" in comparisons_csv(cs).splitlines()[0]


def test_an_overruled_ending_is_not_called_a_window_stop() -> None:
    # A re-audit's plays whose ending conflict the re-auditor did not uphold are censored where they stood, as
    # the window's stops are, and withhold the as-played verdicts the same way; but they are named for what
    # they are: the window stopped none of either run's plays.
    base = [_ep(f"s{i}", 2 + i % 9, kind=i % 3) for i in range(30)]
    judged = [_ep(m.spec_id, m.turns, OVERRULED) if i % 3 == 0 else m for i, m in enumerate(base)]
    (c,) = compare_runs([_fake_run("a", base), _fake_run("b", judged)], resamples=100).compared
    assert c.window == (0.0, 0.0)
    avg = next(d for d in c.rows if d.figure.key == "avg_turns")
    said = sentence(c, avg, 0.95)
    assert "the re-auditor overruled the conflict that ended 33.3% of b's plays" in said and "window" not in said
    assert "no verdict on 7 as-played figures: the re-auditor overruled" in verdict(c)
    # S(t) takes an overruled play as censored: T > n, nothing narrated after it.
    kept = next(d for d in c.rows if d.figure.key == "turns_kept")
    assert not kept.withheld and kept.diff > 0


def test_the_curves_are_compared_no_further_than_both_runs_were_followed() -> None:
    # b's plays were all stopped by the window by turn 3 and none reached further: its S(t) rests on the data to
    # t = 4 only, so turns kept, S(t) and the endings are compared to t = 4, said in a note.
    base = [_ep(f"s{i}", 2 + i % 9, kind=i % 3) for i in range(30)]
    short = [_ep(m.spec_id, min(m.turns, 3), "context_limit") for m in base]
    (c,) = compare_runs([_fake_run("a", base), _fake_run("b", short)], resamples=50).compared
    assert c.horizon == 4 and any("compared to t=4 only" in n for n in c.notes)
    assert "turns_kept" in {d.figure.key for d in c.rows} and "S(10)" not in {d.figure.key for d in c.rows}


# ---- compare's claims, each failing a test when broken (docs/measurements/2026-12-07-corrected-and-censored.md) --


def _shifted(shift: int) -> tuple[list[EpisodeMetrics], list[EpisodeMetrics]]:
    """19 stories of 2 to 38 turns, ended by a conflict; the other run keeps each `shift` turns longer."""
    base = [_ep(f"s{i}", 2 + i) for i in range(0, 37, 2)]
    return base, [_ep(m.spec_id, m.turns + shift) for m in base]


def test_stories_pair_by_their_id_whatever_order_a_run_lists_them_in() -> None:
    # b lists its stories backwards: paired by id, each differs by +1 and the paired interval is exactly [1, 1].
    base, other = _shifted(1)
    (c,) = compare_runs([_fake_run("a", base, 40), _fake_run("b", other[::-1], 40)], resamples=200).compared
    for key in ("avg_turns", "turns_kept"):
        d = next(d for d in c.rows if d.figure.key == key)
        assert (d.diff, d.lo, d.hi) == pytest.approx((1.0, 1.0, 1.0)), key


def test_both_intervals_carry_the_differences_sign_and_the_mdd_the_paired_spread() -> None:
    # Each story 5 turns longer in b: the paired interval is [5, 5]; the unpaired one spans the stories' spread
    # around +5 (its middle above 0, as b minus a). The MDD is 1.96 permutation spreads (each story's +-5 flipped:
    # sd 5 / sqrt(19)) plus 0.84 paired standard errors (0 here), not the unpaired spread.
    base, other = _shifted(5)
    (c,) = compare_runs([_fake_run("a", base, 60), _fake_run("b", other, 60)], resamples=400).compared
    d = next(d for d in c.rows if d.figure.key == "avg_turns")
    assert (d.lo, d.hi) == pytest.approx((5.0, 5.0))
    assert d.unpaired_lo < 5 < d.unpaired_hi and d.unpaired_hi - d.unpaired_lo > 8
    assert (d.unpaired_lo + d.unpaired_hi) / 2 > 2
    assert d.mdd == pytest.approx(1.96 * 5 / math.sqrt(19), rel=0.12)
    assert "5.00 turns higher than baseline" in sentence(c, d, 0.95)


def test_holm_adjusts_each_figure_over_the_runs_compared_with_the_baseline() -> None:
    # Three runs against a: each figure's Holm p is Holm's adjustment of its three raw p-values, never below them.
    base, _ = _shifted(0)
    runs = [_fake_run("a", base, 60)] + [_fake_run(n, _shifted(s)[1], 60) for n, s in (("b", 1), ("c", 0), ("d", 3))]
    cs = compare_runs(runs, resamples=300)
    for key in ("avg_turns", "turns_kept"):
        rows = [next(d for d in c.rows if d.figure.key == key) for c in cs.compared]
        assert [d.p_holm for d in rows] == pytest.approx(holm([d.p for d in rows]))
        assert all(d.p_holm >= d.p for d in rows) and rows[0].p_holm > rows[0].p
    assert "Holm p = " in sentence(cs.compared[0], cs.compared[0].rows[0], 0.95)


def test_the_paired_interval_is_as_wide_as_its_level_asks() -> None:
    # b keeps each story 1 or 3 turns longer, alternately: the mean difference 2 has a standard error of about
    # 1 / sqrt(19) by story, so the 95% paired interval is about 2 x 1.96 / sqrt(19) = 0.90 wide (a 50% one 0.31).
    base, _ = _shifted(0)
    other = [_ep(m.spec_id, m.turns + 1 + 2 * (i % 2)) for i, m in enumerate(base)]
    (c,) = compare_runs([_fake_run("a", base, 60), _fake_run("b", other, 60)], resamples=1000).compared
    d = next(d for d in c.rows if d.figure.key == "avg_turns")
    assert d.lo < 2 < d.hi and 0.7 < d.hi - d.lo < 1.1


def test_a_run_is_named_by_what_sets_it_apart_from_the_baseline() -> None:
    def run(folder: str, **cfg: object) -> SimpleNamespace:
        base = {"seed": 0, "condition": {"name": "adversarial"}, "narrator": {"model": {"name": "m1"}}}
        return SimpleNamespace(path=Path(f"/r/{folder}"), manifest={"config": {**base, **cfg}})

    runs = [
        run("a"),
        run("b", seed=1),
        run("c", condition={"name": "natural"}),
        run("d", narrator={"model": {"name": "m2"}}, trials={"count": 3}),
        run("e"),
        SimpleNamespace(path=Path("/r/ref"), manifest={}),
    ]
    assert short_names(runs) == ["baseline", "seed=1", "condition=natural", "narrator=m2 trials=3", "e", "ref"]
    # Two alike keep their folders beside the name.
    assert short_names([run("a"), run("b", seed=1), run("c", seed=1)]) == [
        "baseline [a]",
        "seed=1 [b]",
        "seed=1 [c]",
    ]


# ---- one wording per figure -------------------------------------------------------------------------------


def test_a_difference_that_rounds_to_zero_is_said_one_way() -> None:
    # 0.004 turns shows as 0.00 in the table: the sentence and the verdict call it equal, never "0.00 lower".
    base = [_ep(f"s{i}", 2 + i % 9, kind=i % 3) for i in range(30)]
    (c,) = compare_runs([_fake_run("a", base), _fake_run("b", base)], resamples=50).compared
    d = next(d for d in c.rows if d.figure.key == "avg_turns")
    for diff in (0.004, -0.004):
        tiny = Difference(**{**d.__dict__, "diff": diff, "p": 0.01})
        (row,) = comparison_rows(Comparison(**{**c.__dict__, "rows": (tiny,)}))
        assert row[3] == "0.00"
        assert "are equal to two decimals" in sentence(c, tiny, 0.95)
        said = verdict(Comparison(**{**c.__dict__, "rows": (tiny,)}))
        assert "avg turns equal to two decimals (p = 0.010)" in said and "0.00 turns" not in said
    big = Difference(**{**d.__dict__, "diff": -0.35})
    assert (
        "is 0.35 turns lower than" in sentence(c, big, 0.95)
        and comparison_rows(Comparison(**{**c.__dict__, "rows": (big,)}))[0][3] == "-0.35"
    )


def test_the_guide_says_the_mdd_as_the_output_does() -> None:
    # The rule is made from the constants the MDD is computed with, and the reports guide states that rule.
    assert MDD_RULE == "1.96 permutation spreads + 0.84 paired standard errors"
    cs = compare_runs([_fake_run("a", [_ep("s0", 3)]), _fake_run("b", [_ep("s0", 4)])], resamples=10)
    assert MDD_RULE in comparisons_note(cs)
    guide = " ".join((ROOT / "docs" / "guide" / "reports.md").read_text().split())
    assert f"with a two-sided 5% test: {MDD_RULE}" in guide
