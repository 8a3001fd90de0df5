"""The official result format both ways: `mode=export export.format=reference` writes a scripted run on
the official dataset as the official code writes results; the official code's own metric functions
(imported from NCP_BENCH_REFERENCE, never copied) give the rig's figures on those files; and the
folder reads back in `mode=report` as a run with the same table."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cli_runner import run_cli
from ncp_local.protocol.metrics import table_row
from ncp_local.report.runs import load_run, load_runs


@pytest.fixture(scope="module")
def official_metrics() -> ModuleType:
    root = os.environ.get("NCP_BENCH_REFERENCE")
    src = Path(root or "/nonexistent") / "src"
    if not (src / "ncpbench" / "metrics.py").is_file():
        pytest.skip("official sources not available (set NCP_BENCH_REFERENCE to a reference clone)")
    sys.path.insert(0, str(src))
    import ncpbench.metrics

    return ncpbench.metrics


@pytest.fixture(scope="module")
def exported(scripted_official_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference-export")
    res = run_cli("mode=export", "export.format=reference", f"runs=[{scripted_official_run}]", f"export.out={out}")
    assert res.returncode == 0, res.stderr
    folder = out / scripted_official_run.name
    assert str(folder) in res.stdout
    return folder


def test_official_metric_functions_give_the_rigs_figures(
    scripted_official_run: Path, exported: Path, official_metrics: ModuleType
) -> None:
    run = load_run(scripted_official_run)
    files = sorted(exported.glob("*.json"))
    assert [f.stem for f in files] == sorted(run.results)
    theirs = {f.stem: official_metrics.compute_episode_metrics(json.loads(f.read_text())) for f in files}
    ours = {m.spec_id: m for m in run.metrics()}
    for sid, t in theirs.items():
        o = ours[sid]
        assert (t.termination, t.turn_count, t.fact_conflict, t.commitment_conflict, t.player_input_conflict) == (
            o.termination,
            o.turns,
            o.fact,
            o.commitment,
            o.player_input,
        ), sid
        assert t.trajectory_progress == pytest.approx(o.trajectory_progress)
        assert t.commitment_satisfaction == pytest.approx(o.satisfied)
    agg = run.aggregate()
    off = official_metrics.aggregate_metrics(list(theirs.values()))
    # The run has every kind of ending, so these agreeing is not a coincidence of zeros.
    assert min(agg.terminations["conflict"], agg.terminations["max_turns"], agg.terminations["all_resolved"]) > 0
    assert agg.fact_pct > 0 and agg.commitment_pct > 0 and agg.player_input_pct > 0
    assert off.episode_count == agg.episodes == 100
    assert off.average_turns == pytest.approx(agg.avg_turns)
    assert 100 * off.average_trajectory_progress == pytest.approx(agg.trajectory_pct)
    assert 100 * off.average_commitment_satisfaction == pytest.approx(agg.satisfied_pct)
    assert 100 * off.fact_conflict_rate == pytest.approx(agg.fact_pct)
    assert 100 * off.commitment_conflict_rate == pytest.approx(agg.commitment_pct)
    assert 100 * off.player_input_conflict_rate == pytest.approx(agg.player_input_pct)
    assert (off.conflict_count, off.max_turns_count, off.all_resolved_count) == (
        agg.terminations["conflict"],
        agg.terminations["max_turns"],
        agg.terminations["all_resolved"],
    )
    curve = official_metrics.survival_curve(list(theirs.values()), max_turns=run.max_turns)
    assert curve == pytest.approx(agg.survival)


def test_exported_folder_reads_back_as_the_same_run(scripted_official_run: Path, exported: Path) -> None:
    rig = load_run(scripted_official_run)
    back = load_run(exported)
    assert back.max_turns == rig.max_turns == 15
    assert {m.spec_id: m for m in back.metrics()} == {m.spec_id: m for m in rig.metrics()}
    assert table_row("x", back.aggregate()) == table_row("x", rig.aggregate())
    # What the folder lacks is said, once, in the run's notes.
    assert any("no call log" in n for n in back.notes)


def test_report_shows_official_folder_beside_rig_run(
    scripted_official_run: Path, exported: Path, tmp_path: Path
) -> None:
    res = run_cli(
        "mode=report",
        f"runs=[{scripted_official_run},{exported}]",
        f"report.out={tmp_path / 'rep'}",
        "report.html=false",
        "report.resamples=50",
    )
    assert res.returncode == 0, res.stderr
    summary = res.stdout.split("what ended each story")[0]
    rows = [line for line in summary.splitlines() if line.startswith("| ") and "| 100 |" in line]
    assert len(rows) == 2
    official = [r for r in rows if r.startswith("| official: ")]
    assert len(official) == 1
    # Same point estimates on both rows (intervals are resampled, so only the points are compared); the
    # last column says what ran: the rig's run was scripted, the official folder records no engine.
    points = [[cell.split(" [")[0] for cell in r.split("|")[2:-2]] for r in rows]
    assert points[0] == points[1]
    assert [r.split("|")[-2].strip() for r in rows] == ["scripted", "not recorded"]
    assert "no call log" in res.stdout


def test_model_names_from_an_official_checkpoint(exported: Path, tmp_path: Path) -> None:
    folder = tmp_path / "official"
    folder.mkdir()
    for f in sorted(exported.glob("*.json"))[:3]:
        (folder / f.name).write_text(f.read_text())
    conf = {"method": "baseline", "condition": "natural", "narrator_model": "gpt-4o-mini"}
    conf |= {"player_model": "gemini-2.5-flash", "auditor_model": "gemini-2.5-flash", "max_turns": 100}
    (folder / "movie99.checkpoint.json").write_text(json.dumps({"configuration": conf, "episode": {}}))
    [run] = load_runs([str(folder)])
    assert run.label == "official: gpt-4o-mini / gemini-2.5-flash / natural / baseline"
    assert run.max_turns == 100 and run.unfinished == ("movie99",)


def test_a_folder_of_another_format_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "movie00.json").write_text(json.dumps({"episode": {"id": "movie00"}, "score": 3}))
    out = tmp_path / "rep"
    res = run_cli("mode=report", f"runs=[{folder}]", f"report.out={out}")
    assert res.returncode == 2
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("error: ") and "movie00.json" in line and "episode.player_role" in line
    assert not out.exists()
