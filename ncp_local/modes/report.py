"""`mode=report`: tables with intervals, survival plot, per-genre tables and HTML over finished runs."""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..execution.layout import require_finished
from ..execution.places import check_destination
from ..report import build_report, default_out, runs_of
from ..report.paper import row_named


def main(cfg: RunConfig, raw: dict) -> int:
    if cfg.compare.paper:
        row_named(cfg.compare.paper)  # an unknown paper row is refused before any run is read
    require_finished(cfg.runs)
    runs = runs_of(cfg)
    out = Path(cfg.report.out).expanduser() if cfg.report.out else default_out(cfg, runs, "report")
    check_destination(out, "report.out")  # before any file is written
    rep = build_report(
        runs,
        out,
        cfg.report.resamples,
        cfg.report.seed,
        cfg.report.level,
        cfg.report.html,
        cfg.report.gpu_hour_cost,
        cfg.report.plan,
        cfg.report.dataset,
        cfg.review.sheet,
        cfg.report.horizon,
        cfg.compare.paper,
    )
    print(rep["summary_md"])
    if rep["compare_md"]:
        print("\n" + rep["compare_md"])
    print("\nwhat ended each story:\n" + rep["endings_md"])
    if rep["trials"]:
        print("\ntrials: pass^k and the noise floor:\n" + rep["trials_md"])
    print("\nthe auditor's error:\n" + rep["auditor_md"])
    print("\ncost by role and stage:\n" + rep["cost_md"])
    for note in rep["notes"]:
        print(note)
    print(
        f"report: {out} (results.md/.csv, genres.md/.csv, cost.csv, survival.png/.svg/.csv, endings.png/.svg/.csv"
        + (", trials.md, passk.png/.svg/.csv, noise.csv, stories.csv" if rep["trials"] else "")
        + (", survival_corrected.csv" if cfg.review.sheet else "")
        + (", compare.csv" if any(p.name == "compare.csv" for p in rep["files"]) else "")
        + (", index.html" if cfg.report.html else "")
        + ")"
    )
    return 0
