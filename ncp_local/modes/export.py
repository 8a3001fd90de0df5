"""`mode=export`: finished runs as files another tool reads. `export.format=inspect` writes one Inspect
`.eval` log per run (report/inspect_log.py), which `inspect view --log-dir DIR` lists and opens;
`export.format=parquet` writes the analysis tables over all the runs (report/parquet.py), one Parquet
file per table, read by pandas, `ncp_local.analysis` or any Arrow reader."""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..execution.layout import require_finished
from ..execution.store import check_destination
from ..report import default_out, run_notes, runs_of
from ..report.inspect_log import build_log, write_log
from ..report.parquet import build_tables, write_tables
from ..report.runs import sweep_points
from ..report.table_rows import Source, point_of


def main(cfg: RunConfig, raw: dict) -> int:
    require_finished(cfg.runs)
    runs = runs_of(cfg)
    fmt = cfg.export.format
    out = Path(cfg.export.out).expanduser() if cfg.export.out else default_out(cfg, runs, fmt)
    if fmt == "parquet":
        points = sweep_points(list(cfg.runs))
        tables = build_tables(Source(run, point_of(run.path, points)) for run in runs)
        check_destination(out, "export.out")
        for path in write_tables(tables, out):
            print(f"{path.stem}: {tables[path.stem].num_rows} rows")
        for line in run_notes(runs):
            print(f"note: {line}")
        print(f"tables: {out}")
        return 0
    logs = [build_log(run, events=cfg.export.events) for run in runs]  # every log builds before a file is written
    check_destination(out, "export.out")
    for run, log in zip(runs, logs, strict=True):
        print(f"{run.label}: {write_log(log, run, out)}")
    print(f"inspect logs: {out} (inspect view --log-dir {out})")
    return 0
