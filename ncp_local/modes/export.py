"""`mode=export`: finished runs as files another tool reads, one function per `export.format`:
`inspect`, one Inspect `.eval` log per run (report/inspect_log.py), which `inspect view --log-dir DIR`
lists and opens; `parquet`, the analysis tables over all the runs (report/parquet.py), one Parquet file
per table, read by pandas, `ncp_local.analysis` or any Arrow reader (plant directories among the runs: the
`plants` table); `reference`, each run's results
as the official NCP-Bench code writes them (report/reference_runs.py), one folder per run, which the
official metric functions and `mode=report` read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..errors import InputError
from ..protocol.trials import episode_name
from ..report import Run, default_out, run_notes, runs_of
from ..report.inspect_log import build_log, write_log
from ..report.parquet import build_tables, write_tables
from ..report.plant_dirs import is_plant_dir, load_plant_dir
from ..report.reference_runs import write_reference_folder
from ..report.run_table import Bootstrap
from ..report.runs import attach_specs, expand_runs, sweep_points
from ..report.table_rows import Source, point_of
from ..rundir.layout import require_finished
from ..rundir.places import check_destination


def _inspect(cfg: RunConfig, runs: list[Run], out: Path) -> None:
    logs = [build_log(run, events=cfg.export.events) for run in runs]  # every log builds before a file is written
    check_destination(out, "export.out")
    for run, log in zip(runs, logs, strict=True):
        print(f"{run.label}: {write_log(log, run, out)}")
    print(f"inspect logs: {out} (inspect view --log-dir {out})")


def _parquet(cfg: RunConfig, runs: list[Run], out: Path) -> None:
    points = sweep_points(list(cfg.runs))
    rep = cfg.report
    boot = Bootstrap(rep.resamples, rep.seed, rep.level, rep.horizon)  # the intervals, as the report's
    plants = [load_plant_dir(p) for p in expand_runs(list(cfg.runs)) if is_plant_dir(p)]
    tables = build_tables((Source(run, point_of(run.path, points)) for run in runs), boot, plants, points)
    check_destination(out, "export.out")
    for path in write_tables(tables, out):
        print(f"{path.stem}: {tables[path.stem].num_rows} rows")
    for line in run_notes(runs):
        print(f"note: {line}")
    print(f"tables: {out}")


def _reference(cfg: RunConfig, runs: list[Run], out: Path) -> None:
    for run in runs:
        attach_specs(run, cfg.report.dataset, required=True)  # the official format carries the spec's texts
    check_destination(out, "export.out")
    for run in runs:
        # The official format plays each story once: a run with trials gives a folder per trial,
        # trial 0's named as the run (protocol/trials.py names the others' folders as their episodes).
        by_trial: dict[int, dict[str, Any]] = {}
        for result in run.results.values():
            by_trial.setdefault(result.trial, {})[result.spec_id] = result
        for trial, results in sorted(by_trial.items()):
            folder = out / episode_name(run.key, trial)
            notes = write_reference_folder(results, run.specs, folder)
            print(f"{run.label}{f' (trial {trial})' if trial else ''}: {folder}")
            for note in notes:
                print(f"  {note}")
    print(f"official result folders: {out} (mode=report runs=[{out}/<run>] reads one back)")


FORMATS = {"inspect": _inspect, "parquet": _parquet, "reference": _reference}


def main(cfg: RunConfig) -> int:
    require_finished(cfg.runs)
    fmt = cfg.export.format
    given = expand_runs(list(cfg.runs)) if cfg.runs else []
    plants = [p for p in given if is_plant_dir(p)]
    if plants and fmt != "parquet":
        raise InputError(plants[0], "runs", "a plant directory (mode=plant) exports only as export.format=parquet")
    # Plant directories are the `plants` table's (_parquet): the rest are runs, when there is any.
    others = [p for p in given if not is_plant_dir(p)]
    runs = runs_of(cfg.model_copy(update={"runs": others})) if others or not plants else []
    if cfg.export.out:
        out = Path(cfg.export.out).expanduser()
    else:
        out = default_out(cfg, runs, fmt) if runs else default_out(cfg, [load_plant_dir(plants[0])], fmt)
    FORMATS[fmt](cfg, runs, out)
    return 0
