"""mode=report: tables, bootstrap intervals, survival, genres, HTML, review sheet.

A small scripted run whose every number is worked out by hand below.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from html import escape as html_escape
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli_runner import CliResult, run_cli
from helpers import Scripted, conflicts, facts, first_check, statuses, tag, traj
from ncp_local.engines.base import ContextOverflow, Request
from ncp_local.errors import InputError
from ncp_local.protocol.records import TurnRecord
from ncp_local.protocol.replay import INTERNAL_LABEL, replay
from ncp_local.protocol.spec import load_dataset
from ncp_local.report import build_report
from ncp_local.report.review import disputed_summary, export_sheet, read_sheet, sample_conflicts
from ncp_local.report.runs import attach_specs, load_run, load_runs
from ncp_local.report.stats import bootstrap, cohen_kappa, confusion, pearson, ranks, spearman
from ncp_local.report.tables import genre_rows, summary_markdown, summary_rows

ROOT = Path(__file__).resolve().parent.parent
GENRES = {
    "a": ["drama", "mystery"],
    "b": ["drama", "comedy"],
    "c": ["comedy", "horror"],
    "d": ["mystery", "horror"],
    "e": ["drama", "horror"],
}
XSS = "<script>alert('x')</script> & \"quoted\""


def spec_doc(sid: str) -> dict[str, Any]:
    return {
        "meta": {"id": sid, "title": f"Story {sid}", "genres": GENRES[sid], "player_role": "a visitor"},
        "synopsis": "A visitor explores an old house.",
        "initial_facts": [
            {"id": f"f_{i}", "content": f"initial fact {i} of {sid}", "negated": False} for i in range(3)
        ],
        "commitments": [
            {
                "id": f"c_{i}",
                "type": t,
                "description": f"commitment {i} of {sid}",
                "satisfaction_condition": f"sat {i}",
                "violation_condition": f"viol {i}",
            }
            for i, t in enumerate(("ordering", "achievement"))
        ],
        "trajectory": [
            {
                "id": f"s_{i}",
                "description": f"node {i} of {sid}",
                "trigger_event": f"trigger {i}",
                "key_delta": f"delta {i}",
            }
            for i in range(3)
        ],
    }


def write_dataset(root: Path) -> Path:
    (root / "specs").mkdir(parents=True)
    (root / "index.yaml").write_text(yaml.safe_dump({"specs": list(GENRES)}))
    for sid in GENRES:
        (root / "specs" / f"{sid}.yaml").write_text(yaml.safe_dump(spec_doc(sid), sort_keys=False))
    return root


def rules(req: Request) -> str | None:
    """a: node at t0, c_0 satisfied, fact conflict at t1 -> 2 turns, traj 1/3, sat 1/2.
    b: nodes at t0 and t2, a fact added at t1 and f_1 negated at t2, runs to max_turns=4 -> traj 2/3, sat 0.
    c: achievement c_1 satisfied at t2 -> all_resolved after 3 turns, traj 0, sat 1/2.
    d: commitment + player-input conflict at t0 -> 1 turn.
    e: the narrator fails every attempt at t1 -> invalid after 1 turn."""
    stage, ep, turn, _ = tag(req)
    if stage == "narrate" and ep == "b" and turn == 0:
        return json.dumps({"text": XSS})
    if stage == "narrate" and ep == "e" and turn == 1:
        return "not json"
    if stage == "fact_update" and ep == "b":
        return facts(add=["a new fact"]) if turn == 1 else facts(negate=["f_1"]) if turn == 2 else facts()
    if stage in ("conflict_check", "double_check"):
        extra = {"confirmed": True, "review_reason": "confirmed on review"} if stage == "double_check" else {}
        if ep == "a" and turn == 1:
            return conflicts([("fact", "f_0")], **extra)
        if ep == "d" and turn == 0:
            return conflicts([("commitment", "c_0"), ("player_input", "player_input")], **extra)
        return conflicts([], **extra)
    if stage == "trajectory_check":
        return traj((ep == "a" and turn == 0) or (ep == "b" and turn in (0, 2)))
    if stage == "status_check":
        sat = {"c_0"} if ep == "a" else ({"c_1"} if ep == "c" and turn >= 2 else set())
        return statuses(req, sat)
    return None


def censoring_rules(req: Request) -> str | None:
    """a: the narrator's call at turn 2 does not fit the window -> context_limit after 2 committed turns.
    b: a fact conflict that is an internal contradiction of the narration (`response_internal`) at t1.
    c: a player-input conflict under the reference's id `input` at t0.
    d: the opening does not fit -> context_limit with no turn at all.
    e: runs to max_turns=4."""
    stage, ep, turn, _ = tag(req)
    if (ep, stage, turn) in (("a", "narrate", 2), ("d", "opening", -1)):
        raise ContextOverflow(f"prompt of 9000 tokens exceeds max_model_len 8192 (tags: {req.tags})")
    if stage in ("conflict_check", "double_check"):
        extra = {"confirmed": True, "review_reason": "confirmed on review"} if stage == "double_check" else {}
        if ep == "b" and turn == 1:
            return conflicts([("fact", "response_internal")], **extra)
        if ep == "c" and turn == 0:
            return conflicts([("player_input", "input")], **extra)
        return conflicts([], **extra)
    if stage == "trajectory_check":
        return traj(False)
    if stage == "status_check":
        return statuses(req, set())
    return None


def make_run(root: Path, dataset: Path, ids: list[str] | None = None, rules: Any = rules) -> Path:
    ds = load_dataset(dataset)
    specs = [s for s in ds.specs if ids is None or s.id in ids]
    Scripted(root, specs, rules=rules, max_turns=4).run()
    manifest = json.loads((root / "manifest.json").read_text())
    manifest.update(
        {
            "dataset": {"path": str(dataset), "sha256": ds.sha256, "specs": [s.id for s in ds.specs]},
            "config": {
                "narrator": {"model": {"name": "narr-x"}},
                "auditor": {"model": {"name": "aud-y"}},
                "condition": {"name": "adversarial"},
                "method": {"name": "baseline"},
                "max_turns": 4,
            },
        }
    )
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("report")
    return make_run(base / "run", write_dataset(base / "dataset"))


@pytest.fixture(scope="module")
def censored_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The censoring run, with bound hits on e's turn 1 and a's opening (rewritten unsealed, as an older
    rig's files are: the report reads both)."""
    base = tmp_path_factory.mktemp("censored")
    root = make_run(base / "run", write_dataset(base / "dataset"), rules=censoring_rules)
    for sid, edit in (
        ("e", lambda d: d["turns"][1].update(bound_hits=["narrate:text_chars", "fact_update:new_facts"])),
        ("a", lambda d: d.update(opening_bound_hits=["opening:text_chars"])),
    ):
        path = root / "results" / f"{sid}.json"
        data = json.loads(path.read_text())
        data.pop("seal", None)
        edit(data)
        path.write_text(json.dumps(data))
    return root


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


# ---- statistics ---------------------------------------------------------------


def test_stats_by_hand() -> None:
    # p_o = 3/4, p_e = .5*.25 + .5*.75 = .5 -> kappa = .5
    assert cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5)
    assert cohen_kappa([1, 0, 1], [1, 0, 1]) == 1.0
    assert math.isnan(cohen_kappa([0, 0], [0, 0]))  # undefined: one label for everything
    assert confusion([1, 1, 0, 0], [1, 0, 1, 0]) == {"yes_yes": 1, "yes_no": 1, "no_yes": 1, "no_no": 1}
    assert list(ranks([3, 1, 2, 2])) == [4, 1, 2.5, 2.5]
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))


def test_bootstrap_contains_point_and_is_seeded() -> None:
    cols = {"x": [1.0, 4.0, 2.0, 8.0, 3.0], "y": [0, 100, 0, 0, 100]}
    a = bootstrap(cols, resamples=2000, seed=7)
    assert a == bootstrap(cols, resamples=2000, seed=7)
    assert a != bootstrap(cols, resamples=2000, seed=8)
    for iv in a.values():
        assert iv.lo <= iv.point <= iv.hi
    assert a["x"].point == pytest.approx(3.6) and a["y"].point == pytest.approx(40)
    assert 1.0 <= a["x"].lo < a["x"].hi <= 8.0
    total = bootstrap({"n": [1, 0, 1, 1]}, seed=0, reduce="sum")["n"]
    assert total.point == 3 and 0 <= total.lo <= 3 <= total.hi <= 4


# ---- the table ------------------------------------------------------------------


def test_summary_numbers_by_hand(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.label == "narr-x / aud-y / adversarial / baseline"
    assert list(run.results) == ["a", "b", "c", "d", "e"]  # dataset order from the manifest
    [row] = summary_rows([run], resamples=2000, seed=0, level=0.95)
    agg = row.agg
    assert (agg.episodes, agg.scored) == (5, 4)
    assert agg.avg_turns == pytest.approx((2 + 4 + 3 + 1) / 4)
    assert agg.trajectory_pct == pytest.approx(100 * (1 / 3 + 2 / 3 + 0 + 0) / 4)
    assert agg.satisfied_pct == pytest.approx(100 * (0.5 + 0 + 0.5 + 0) / 4)
    assert (agg.fact_pct, agg.commitment_pct, agg.player_input_pct) == (25, 25, 25)
    assert agg.conflict_free == 2
    assert agg.terminations == {"conflict": 2, "max_turns": 1, "all_resolved": 1, "context_limit": 0, "invalid": 1}
    assert agg.censored == 0
    assert agg.survival == pytest.approx((1, 1, 0.75, 0.5, 0.25))
    for key, iv in row.ci.items():
        assert iv.lo <= iv.point <= iv.hi, key
    assert row.ci["avg_turns"].point == pytest.approx(2.5) and row.ci["conflict_free"].point == 2
    again = summary_rows([load_run(run_dir)], resamples=2000, seed=0, level=0.95)[0]
    assert again.ci == row.ci


def test_genre_table_by_hand(run_dir: Path) -> None:
    run = load_run(run_dir)
    attach_specs(run)
    rows = {r.genre: r.agg for r in genre_rows(run)}
    assert list(rows) == ["comedy", "drama", "horror", "mystery"]  # e is invalid: left out
    drama, mystery, comedy, horror = rows["drama"], rows["mystery"], rows["comedy"], rows["horror"]
    assert (drama.episodes, drama.avg_turns, drama.trajectory_pct, drama.satisfied_pct) == (2, 3, pytest.approx(50), 25)
    assert (drama.fact_pct, drama.commitment_pct, drama.player_input_pct) == (50, 0, 0)
    assert (mystery.avg_turns, mystery.trajectory_pct) == (1.5, pytest.approx(100 / 6))
    assert (mystery.fact_pct, mystery.commitment_pct, mystery.player_input_pct) == (50, 50, 50)
    assert (comedy.avg_turns, comedy.trajectory_pct, comedy.satisfied_pct) == (3.5, pytest.approx(100 / 3), 25)
    assert (horror.avg_turns, horror.commitment_pct, horror.player_input_pct) == (2, 50, 50)


def test_report_files(run_dir: Path, tmp_path: Path) -> None:
    runs = load_runs([str(run_dir), str(run_dir)])
    assert runs[0].label != runs[1].label  # told apart even when the manifests agree
    for r in runs:
        attach_specs(r)
    out = tmp_path / "rep"
    rep = build_report(runs, out, resamples=500, seed=3)
    for name in (
        "results.md",
        "results.csv",
        "genres.md",
        "genres.csv",
        "survival.png",
        "survival.svg",
        "survival.csv",
        "index.html",
    ):
        assert (out / name).stat().st_size > 100, name
    assert (out / "survival.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (out / "survival.svg").read_text()
    rows = read_csv(out / "results.csv")
    assert [r["avg_turns"] for r in rows] == ["2.5", "2.5"] and rows[0]["invalid"] == "1"
    assert float(rows[0]["avg_turns_lo"]) <= 2.5 <= float(rows[0]["avg_turns_hi"])
    surv = read_csv(out / "survival.csv")
    assert [float(r[runs[0].label]) for r in surv] == pytest.approx([1, 1, 0.75, 0.5, 0.25])
    genres = read_csv(out / "genres.csv")
    assert {(g["genre"], g["episodes"]) for g in genres} >= {("drama", "2"), ("horror", "2")}
    assert "| run | episodes | avg turns |" in rep["summary_md"] and "2.50 [" in rep["summary_md"]
    # Same runs, same seed: the same files.
    first = (out / "results.csv").read_bytes(), (out / "survival.svg").read_bytes()
    build_report(runs, out, resamples=500, seed=3)
    assert ((out / "results.csv").read_bytes(), (out / "survival.svg").read_bytes()) == first


def test_shards_read_as_one_run(run_dir: Path, tmp_path: Path) -> None:
    dataset = Path(json.loads((run_dir / "manifest.json").read_text())["dataset"]["path"])
    root = tmp_path / "sharded"
    make_run(root / "shard-000-of-003", dataset, ["a", "c", "e"])
    make_run(root / "shard-001-of-003", dataset, ["b", "d"])
    run = load_run(root)
    assert sorted(run.results) == ["a", "b", "c", "d", "e"] and len(run.shards) == 2
    assert any("2 of 3 shards present (missing 002)" in n for n in run.notes)
    whole = summary_rows([load_run(run_dir)], 200, 0, 0.95)[0].agg
    assert summary_rows([run], 200, 0, 0.95)[0].agg == whole


def test_html_pages(run_dir: Path, tmp_path: Path) -> None:
    run = load_run(run_dir)
    attach_specs(run)
    out = tmp_path / "rep"
    build_report([run], out, resamples=100)
    index = (out / "index.html").read_text()
    assert index.count('<tr class="episode"') == 5
    # Nothing to fetch: no external src/href/url() (XML namespace names are not fetched).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\((?!#)|@import|<link""", index)
    assert "<svg" in index  # the survival plot, inline
    a = (out / "episodes" / "00-run" / "a.html").read_text()
    assert 'class="conflict"' in a and "initial fact 0 of a" in a and "confirmed on review" in a
    assert 'class="card turn conflict-turn" id="t2"' in a  # turn id 1: the paper's turn 2
    b = (out / "episodes" / "00-run" / "b.html").read_text()
    assert "<script>alert" not in b
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quoted&quot;" in b
    assert 'class="conflict"' not in b
    # b's ledger: f_3 added at turn id 1, f_1 negated at turn id 2; nodes at turn ids 0 and 2 (shown from 1).
    assert "<span class=fid>f_3</span> a new fact" in b
    assert '<tr class="inactive"><td><span class=fid>f_1</span>' in b and "<td>turn 3</td></tr>" in b
    assert "<td>turn 1</td>" in b and "<td>turn 0</td>" not in b


def test_replay_matches_stored_final_state(run_dir: Path) -> None:
    run = load_run(run_dir)
    attach_specs(run)
    for sid, result in run.results.items():
        rp = replay(run.specs[sid], result)
        assert rp.problems == ()
        assert rp.final.facts == result.final_state.facts
    views = replay(run.specs["b"], run.results["b"]).turns
    assert [f.id for f in views[1].update.added] == ["f_3"]
    assert [f.id for f in views[2].update.negated] == ["f_1"]
    assert [f.id for f in views[2].before.facts] == ["f_0", "f_1", "f_2", "f_3"]


# ---- review ---------------------------------------------------------------------


def test_review_round_trip(run_dir: Path, tmp_path: Path) -> None:
    run = load_run(run_dir)
    attach_specs(run)
    assert sample_conflicts([run], 1, seed=4) == sample_conflicts([run], 1, seed=4)
    csv_path, html_path, n = export_sheet([run], tmp_path, n=10, seed=0)
    assert n == 3  # a: one fact conflict; d: a commitment and a player-input conflict
    rows = read_csv(csv_path)
    by_type = {r["type"]: r for r in rows}
    assert by_type["fact"]["target_text"] == "initial fact 0 of a"
    assert by_type["commitment"]["target_text"] == "commitment 0 of d"
    page = html_path.read_text()
    assert page.count('value="dispute"') == 3 and page.count('value="agree"') == 3
    assert "<script>alert" not in page and "initial fact 0 of a" in page
    for r in rows:
        r["verdict"] = {"fact": "dispute", "commitment": "Agree", "player_input": ""}[r["type"]]
    filled = tmp_path / "filled.csv"
    with open(filled, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = {s.type: s for s in disputed_summary(read_sheet(filled))}
    assert (summary["fact"].reviewed, summary["fact"].disputed, summary["fact"].rate) == (1, 1, 1.0)
    assert summary["commitment"].rate == 0.0
    assert summary["player_input"].reviewed == 0 and summary["player_input"].rate is None
    assert (summary["all"].items, summary["all"].reviewed, summary["all"].rate) == (3, 2, 0.5)
    rows[0]["verdict"] = "maybe"
    with open(filled, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(InputError, match="row 2: verdict"):
        read_sheet(filled)


# ---- the entry point ------------------------------------------------------------


def _run(*args: str, cwd: Path) -> CliResult:
    return run_cli(*args, cwd=cwd)


def test_cli_report_and_review(tmp_path: Path) -> None:
    out = tmp_path / "r"
    first = _run(
        "engine=scripted", "max_turns=4", f"out_dir={out}", "progress=false", "engine.conflict_rate=0.4", cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    rep = _run("mode=report", f"runs=[{out}]", "report.resamples=300", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert "scripted / scripted / adversarial / baseline" in rep.stdout  # no model ran: not labelled as one
    assert (out / "report" / "results.md").exists() and (out / "report" / "index.html").exists()
    assert len(list((out / "report" / "episodes").glob("*/*.html"))) == 3
    genres = read_csv(out / "report" / "genres.csv")
    assert len({g["genre"] for g in genres}) >= 4  # our own specs: two genres each

    review = _run("mode=review", f"runs=[{out}]", "review.n=2", cwd=tmp_path)
    assert review.returncode == 0, review.stderr
    sheet = out / "review" / "review_sheet.csv"
    rows = read_csv(sheet)
    for r in rows:
        r["verdict"] = "dispute"
    with open(sheet, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    back = _run("mode=review", f"review.sheet={sheet}", cwd=tmp_path)
    assert back.returncode == 0, back.stderr
    assert f"| all | {len(rows)} | {len(rows)} | {len(rows)} | 100.0 |" in back.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("mode=report",), "runs: give at least one run directory"),
        (("mode=report", "runs=[nowhere]"), "nowhere: runs: no such run directory"),
        (("mode=review", "review.sheet=missing.csv"), "missing.csv: review.sheet: cannot read"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    res = _run(*args, cwd=tmp_path)
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_official_genres(official_dataset: Path, tmp_path: Path) -> None:
    from ncp_local.protocol import ledger
    from ncp_local.protocol.records import EpisodeResult
    from ncp_local.protocol.spec import load_spec

    # One stored result per official spec (no episode is run: only genres matter here).
    ids = yaml.safe_load((official_dataset / "index.yaml").read_text())["specs"]
    (tmp_path / "run" / "results").mkdir(parents=True)
    for sid in ids:
        spec = load_spec(official_dataset / "specs" / f"{sid}.yaml")
        result = EpisodeResult(
            spec_id=sid,
            termination="max_turns",
            opening="o",
            opening_update=None,
            turns=(),
            final_state=ledger.initial_state(spec),
            max_turns=1,
        )
        (tmp_path / "run" / "results" / f"{sid}.json").write_text(result.model_dump_json())
    run = load_run(tmp_path / "run")
    attach_specs(run, str(official_dataset))
    rows = genre_rows(run)
    assert len(rows) == 21  # the release's distinct labels, one row each
    assert sum(r.agg.episodes for r in rows) == 200  # every spec has exactly two genres


# ---- censoring (context_limit), the reference's conflict ids, bound hits ----------


def test_context_limit_censored_in_tables(censored_dir: Path, tmp_path: Path) -> None:
    run = load_run(censored_dir)
    attach_specs(run)
    assert {sid: (r.termination, len(r.turns)) for sid, r in run.results.items()} == {
        "a": ("context_limit", 2),
        "b": ("conflict", 2),
        "c": ("conflict", 1),
        "d": ("context_limit", 0),
        "e": ("max_turns", 4),
    }
    assert "context_overflow" in run.results["a"].reason
    [row] = summary_rows([run], resamples=300, seed=0, level=0.95)
    agg = row.agg
    assert (agg.episodes, agg.scored, agg.censored) == (5, 5, 2)
    assert agg.terminations == {"conflict": 2, "max_turns": 1, "all_resolved": 0, "context_limit": 2, "invalid": 0}
    assert agg.avg_turns == pytest.approx((2 + 2 + 1 + 0 + 4) / 5)  # censored ones at their committed turns
    assert (agg.fact_pct, agg.commitment_pct, agg.player_input_pct) == (20, 0, 20)
    assert agg.bound_hits == 3
    # Kaplan-Meier, T > n for a censored episode of n turns (d: 0, a: 2):
    #   T = 0: d censored, no step; at risk after it: a, b, c, e
    #   T = 1: at risk 4, c ends -> 3/4 = 0.75 = S(2)
    #   T = 2: at risk 3 (a, b, e), b ends -> 0.75 * 2/3 = 0.5 = S(3); a leaves after it
    #   T = 4: e, beyond S(4) -> S(0..4) = 1, 1, 0.75, 0.5, 0.5
    assert agg.survival == pytest.approx((1, 1, 0.75, 0.5, 0.5), abs=1e-12)
    for lo, s, hi in zip(agg.survival_lo, agg.survival, agg.survival_hi, strict=True):
        assert 0 <= lo <= s <= hi <= 1
    assert agg.survival_lo[2] < 0.75 < agg.survival_hi[2]
    # Turns kept, the area under S(t) to the cap: S(1..4) = 1 + 0.75 + 0.5 + 0.5 = 2.75, above avg turns
    # (1.8), which stops the two censored episodes at their committed turns.
    kept = row.ci["turns_kept"]
    assert kept.point == pytest.approx(2.75) and kept.lo <= 2.75 <= kept.hi and row.horizon == 4
    # report.horizon=3: S(1..3) = 2.25; a horizon past the cap stops at the cap.
    [short] = summary_rows([run], resamples=50, seed=0, level=0.95, horizon=3)
    assert (short.ci["turns_kept"].point, short.horizon) == (pytest.approx(2.25), 3)
    assert summary_rows([run], resamples=50, seed=0, level=0.95, horizon=40)[0].horizon == 4

    md = summary_markdown([row], 0.95)
    header = md.splitlines()[0]
    assert "| context_limit |" in header and header.endswith("| bound hits |")
    assert "2 of 5 scored episode(s) censored (context_limit)" in md

    out = tmp_path / "rep"
    build_report([run], out, resamples=300, seed=0)
    [csv_row] = read_csv(out / "results.csv")
    assert (csv_row["censored"], csv_row["context_limit"], csv_row["invalid"], csv_row["bound_hits"]) == (
        "2",
        "2",
        "0",
        "3",
    )
    surv = read_csv(out / "survival.csv")
    label = run.label
    assert [float(r[label]) for r in surv] == pytest.approx([1, 1, 0.75, 0.5, 0.5])
    # d (0 turns) counts through t = 1, a (2 turns) through t = 3: censored after those t.
    assert [int(r[f"{label} censored"]) for r in surv] == [0, 1, 0, 1, 0]
    for r in surv:
        assert float(r[f"{label} lo"]) <= float(r[label]) <= float(r[f"{label} hi"])
    assert "censored" in (out / "survival.svg").read_text()  # the title says what the marks are
    genres = {g["genre"]: g for g in read_csv(out / "genres.csv")}
    assert genres["drama"]["censored"] == "1"  # a (drama, mystery) is censored, b and e are not
    assert "2 of 5 scored episode(s) censored" in (out / "results.md").read_text()


def test_context_limit_and_conflict_ids_in_html(censored_dir: Path, tmp_path: Path) -> None:
    run = load_run(censored_dir)
    attach_specs(run)
    out = tmp_path / "rep"
    build_report([run], out, resamples=100)
    index = (out / "index.html").read_text()
    assert "2 censored</div>" in index  # beside the episode count of the run
    assert re.search(r"context_limit</span>&nbsp;<b>2</b>", index)
    assert index.count('data-termination="context_limit"') == 2
    assert re.search(r'<tr class="episode" data-termination="context_limit" data-spec="a">.*?>2\+</td>', index)
    assert re.search(r'<tr class="episode" data-termination="context_limit" data-spec="d">.*?>0\+</td>', index)
    assert '<option value="context_limit">' in index  # the filter offers it

    a = (out / "episodes" / "00-run" / "a.html").read_text()
    assert 'class="warn censored"' in a and "counts it as running through t = 3" in a
    assert "<b>2+</b>" in a and 'class="card turn opening bound-hit"' in a and "opening:text_chars" in a
    assert "a call of turn 3 no longer fit" in a  # 2 committed turns, the third under way
    d = (out / "episodes" / "00-run" / "d.html").read_text()
    assert "a call of the opening no longer fit" in d and "counts it as running through t = 1" in d

    b = (out / "episodes" / "00-run" / "b.html").read_text()
    block = re.search(r'<div class="conflict" data-type="fact">(.*?)</dl></div>', b, re.S)
    assert block, "the internal contradiction is shown as the fact conflict that ended the episode"
    assert "internal contradiction</span>" in block.group(1) and INTERNAL_LABEL in block.group(1)
    assert "<span class=fid>response_internal</span>" not in block.group(1)
    assert "(not raised by the first check)" not in block.group(1)

    c = (out / "episodes" / "00-run" / "c.html").read_text()
    block = re.search(r'<div class="conflict" data-type="player_input">(.*?)</dl></div>', c, re.S)
    assert block and "(not raised by the first check)" not in block.group(1)
    player = run.results["c"].turns[0].player_input
    assert f"<div class=target>{html_escape(player)}</div>" in block.group(1)

    e = (out / "episodes" / "00-run" / "e.html").read_text()
    assert 'class="card turn bound-hit" id="t2"' in e and 'class="card turn" id="t1"' in e  # turn ids 1, 0
    assert "narrate:text_chars" in e and "fact_update:new_facts" in e
    assert re.search(r'data-spec="e">.*?<td class=num>2</td></tr>', index)  # e's bound hits in its row


def test_review_sheet_shows_internal_and_input_conflicts(censored_dir: Path, tmp_path: Path) -> None:
    run = load_run(censored_dir)
    attach_specs(run)
    csv_path, html_path, n = export_sheet([run], tmp_path, n=10, seed=0)
    assert n == 2  # b and c: the context_limit episodes are no conflict terminations
    rows = {r["spec_id"]: r for r in read_csv(csv_path)}
    assert (rows["b"]["type"], rows["b"]["target_id"], rows["b"]["target_text"]) == (
        "fact",
        "response_internal",
        INTERNAL_LABEL,
    )
    assert rows["b"]["response"] == run.results["b"].turns[-1].response  # what contradicts itself
    assert (rows["c"]["type"], rows["c"]["target_id"]) == ("player_input", "input")
    assert rows["c"]["target_text"] == run.results["c"].turns[0].player_input
    page = html_path.read_text()
    assert page.count("internal contradiction</span>") == 1
    # Filled in and read back, the internal contradiction counts as a fact conflict.
    for r in rows.values():
        r["verdict"] = "dispute" if r["type"] == "fact" else "agree"
    filled = tmp_path / "filled.csv"
    with open(filled, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows["b"]))
        w.writeheader()
        w.writerows(rows.values())
    summary = {s.type: s for s in disputed_summary(read_sheet(filled))}
    assert (summary["fact"].items, summary["fact"].disputed) == (1, 1)
    assert (summary["player_input"].items, summary["player_input"].disputed) == (1, 0)


def test_conflict_details_without_the_spec(censored_dir: Path) -> None:
    from ncp_local.protocol.replay import conflict_details

    run = load_run(censored_dir)  # no specs attached
    b, c = run.results["b"].turns[-1], run.results["c"].turns[-1]
    [internal] = conflict_details(None, None, b)
    assert (internal["type"], internal["internal"], internal["target_text"]) == ("fact", True, INTERNAL_LABEL)
    [pi] = conflict_details(None, None, c)
    assert (pi["type"], pi["id"], pi["target_text"]) == ("player_input", "input", c.player_input)
    # An older record that said `player_input` is matched to its first check all the same.
    old = TurnRecord.model_validate(
        {
            **c.model_dump(),
            "conflicts": ({"type": "player_input", "id": "player_input", "reason": "late"},),
            "conflict_check": first_check([("player_input", "input")], reason="early"),
        }
    )
    [d] = conflict_details(None, None, old)
    assert (d["reason_initial"], d["reason_reviewed"]) == ("early", "late")
