"""`mode=report`: tables with intervals, survival plot, per-genre tables and HTML over finished runs."""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..execution.preflight import plan_growth
from ..report import build_report, default_out, files_listing, runs_of
from ..report.paper import row_named
from ..rundir.layout import require_finished
from ..rundir.places import check_destination


def main(cfg: RunConfig) -> int:
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
        plan_growth if cfg.report.plan else None,
        cfg.report.dataset,
        cfg.review.sheet,
        cfg.report.horizon,
        cfg.compare.paper,
    )
    print(rep["ran_md"] + rep["summary_md"])
    if rep["compare_md"]:
        print("\n" + rep["compare_md"])
    print("\nwhat ended each story:\n" + rep["endings_md"])
    if rep["trials"]:
        print("\ntrials: pass^k and the noise floor:\n" + rep["trials_md"])
    print("\nthe auditor's error:\n" + rep["auditor_md"])
    print("\ncost by role and stage:\n" + rep["cost_md"])
    for note in rep["notes"]:
        print(note)
    # Only what was written: the plots are skipped without a folder matplotlib can write.
    print(f"report: {out} ({files_listing(out, rep['files'])})")
    return 0
