"""`mode=report`: tables with intervals, survival plot, per-genre tables and HTML over runs, finished or in flight."""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..execution.preflight import plan_growth
from ..report import build_report, default_out, files_listing, runs_of
from ..report.brief import report_brief
from ..report.in_flight import NOTHING_YET, count_in_flight, nothing_yet
from ..report.paper import row_named
from ..report.plant_dirs import PlantDir, is_plant_dir, load_plant_dir, plant_figures
from ..report.plants_doc import write_plant_report
from ..report.runs import expand_runs
from ..rundir.places import check_destination


def main(cfg: RunConfig) -> int:
    if cfg.compare.paper:
        row_named(cfg.compare.paper)  # an unknown paper row is refused before any run is read
    # Plant directories (mode=plant) are auditors measured on planted items: their own section and files.
    plants = [p for p in expand_runs(list(cfg.runs)) if is_plant_dir(p)]
    dirs = [load_plant_dir(p) for p in plants]
    if plants:
        _plants(cfg, dirs)
        cfg = cfg.model_copy(update={"runs": [p for p in expand_runs(list(cfg.runs)) if not is_plant_dir(p)]})
        if not cfg.runs:
            return 0
    runs = runs_of(cfg)
    for run in runs:
        count_in_flight(run)  # episodes still playing: censored at their last committed turn
    # A run with nothing yet is said so, not failed: left out beside runs that have something.
    empty = [r for r in runs if nothing_yet(r)]
    for run in empty:
        print(f"{run.path}: {NOTHING_YET}" + (" (left out of this report)" if len(empty) < len(runs) else ""))
    runs = [r for r in runs if not nothing_yet(r)]
    if not runs:
        return 0
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
        dirs,  # a run's auditor measured by mode=plant: its rates corrected for the misses
    )
    # The answer first, at most brief.BUDGET lines; every detail is in the files, named last.
    closing = [
        "details ("
        + ("each figure's test, " if rep["comparisons"] else "")
        + ("survival, failure modes, trials, " if rep["trials"] else "survival, failure modes, ")
        + "the auditor's error, "
        + ("the auditor's misses, " if rep["misses_md"] else "")
        + "cost, per genre): results.md"
        + (", index.html" if cfg.report.html else ""),
        f"report: {out} ({files_listing(out, rep['files'])})",
    ]
    print(
        report_brief(
            runs, rep["rows"], rep["comparisons"], rep["endings"], rep["notes"], closing, rep["paper"], cfg.report.level
        )
    )
    return 0


def _plants(cfg: RunConfig, dirs: list[PlantDir]) -> None:
    out = Path(cfg.report.out).expanduser() if cfg.report.out else dirs[0].path / "report"
    check_destination(out, "report.out")
    figs, cmps, notes = plant_figures(dirs, cfg.report.resamples, cfg.report.seed, cfg.report.level)
    md, files = write_plant_report(
        out, figs, cmps, dirs[0].results, cfg.report.level, cfg.report.resamples, notes, cfg.report.html
    )
    print(md)
    print(f"report: {out} ({files_listing(out, files)})")
