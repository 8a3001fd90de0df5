"""Turns kept (the restricted mean) beside avg turns in every output that shows a run's figures (issue 58).

One censored scripted run (test_report.py's `censoring_rules`: two of five episodes stopped by the window)
whose avg turns is 1.8 and whose turns kept to the cap of 4 is 2.75 (S(1..4) = 1, 0.75, 0.5, 0.5): each
output must carry both, so a table, file or index that loses the restricted mean fails here.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ncp_local import analysis
from ncp_local import config as config_mod
from ncp_local.execution.life import Point
from ncp_local.launch.point_index import write_index
from ncp_local.report import build_report
from ncp_local.report.parquet import build_tables, read_table, write_tables
from ncp_local.report.run_table import Bootstrap
from ncp_local.report.runs import load_run
from ncp_local.report.table_rows import Source
from ncp_local.report.table_schema import RUNS
from ncp_local.report.tables import METRICS
from ncp_local.tracking.record import run_record
from test_report import censoring_rules, make_run, write_dataset

AVG, KEPT = 1.8, 2.75


@pytest.fixture(scope="module")
def censored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("kept")
    return make_run(base / "run", write_dataset(base / "dataset"), rules=censoring_rules)


@pytest.fixture(scope="module")
def report(censored: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kept-report")
    build_report([load_run(censored)], out, resamples=50, seed=0)
    return out


def test_the_main_table_and_its_csv(report: Path) -> None:
    lines = [line for line in (report / "results.md").read_text().splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row = [c.strip() for c in lines[1].strip("|").split("|")]
    assert row[header.index("avg turns")].startswith(f"{AVG:.2f} [")
    assert row[header.index("turns kept")].startswith(f"{KEPT:.2f} [")
    [rec] = csv.DictReader(io.StringIO((report / "results.csv").read_text()))
    assert (float(rec["avg_turns"]), float(rec["turns_kept"]), rec["horizon"]) == (AVG, KEPT, "4")
    assert float(rec["turns_kept_lo"]) <= KEPT <= float(rec["turns_kept_hi"])


def test_the_html_page(report: Path) -> None:
    page = (report / "index.html").read_text()
    assert "turns kept" in page and f"{KEPT:.2f}" in page and f"{AVG:.2f}" in page


def test_the_parquet_runs_table(censored: Path, tmp_path: Path) -> None:
    tables = build_tables([Source(load_run(censored), "seed=1")], Bootstrap(resamples=50))
    write_tables(tables, tmp_path)
    [row] = read_table(tmp_path, "runs").to_pylist()
    assert (row["avg_turns"], row["turns_kept"], row["horizon"], row["turn_cap"]) == (AVG, KEPT, 4, 4)
    assert row["turns_kept_lo"] <= KEPT <= row["turns_kept_hi"] and row["point"] == "seed=1"
    assert (row["censored"], row["context_limit"], row["resamples"]) == (3, 2, 50)
    # Every figure of the main table has its three columns, and the loader returns the same row.
    assert {f"{k}{s}" for k, _, _ in METRICS for s in ("", "_lo", "_hi")} <= set(RUNS.names)
    assert analysis.runs(tmp_path).turns_kept.tolist() == [KEPT]


def test_the_tracker_record(censored: Path) -> None:
    raw = OmegaConf.to_container(config_mod.compose(["report.resamples=50", "+tracker.report=false"]), resolve=True)
    rec = run_record(config_mod.validate(raw), censored)  # type: ignore[arg-type]
    assert (rec.metrics["avg_turns"], rec.metrics["turns_kept"], rec.metrics["horizon"]) == (AVG, KEPT, 4)
    assert rec.metrics["turns_kept_lo"] <= KEPT <= rec.metrics["turns_kept_hi"]


def test_the_sweep_index(censored: Path, tmp_path: Path) -> None:
    points = [
        Point(0, ("seed=0",), mode="run", out=censored, status="done", code=0),
        Point(1, ("seed=1",), mode="run", out=tmp_path / "never", status="failed", code=2),
    ]
    write_index(tmp_path, points, None, "basic")
    done, failed = json.loads((tmp_path / "index.json").read_text())["points"]
    assert (done["avg_turns"], done["turns_kept"], done["horizon"]) == (AVG, KEPT, 4)
    assert "turns_kept" not in failed  # a point with no finished run says nothing
    md = (tmp_path / "index.md").read_text().splitlines()
    assert md[0].startswith("| job | status | exit | avg turns | turns kept |")
    assert md[2].startswith(f"| 0 | done | 0 | {AVG:.2f} | {KEPT:.2f} |")
