"""`mode=export`: finished runs as files another tool reads. `export.format=inspect` writes one
Inspect `.eval` log per run (report/inspect_log.py), which `inspect view --log-dir DIR` lists and
opens; `export.format=reference` writes each run's results as the official NCP-Bench code writes
them (report/reference_runs.py), one folder per run, which the official metric functions and
`mode=report` read."""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..execution.layout import require_finished
from ..execution.store import check_destination
from ..report import Run, default_out, runs_of
from ..report.inspect_log import build_log, write_log
from ..report.reference_runs import write_reference_folder
from ..report.runs import attach_specs


def _inspect(runs: list[Run], out: Path) -> None:
    logs = [build_log(run) for run in runs]  # every log builds (inspect_ai is there) before a file is written
    check_destination(out, "export.out")
    for run, log in zip(runs, logs, strict=True):
        print(f"{run.label}: {write_log(log, run, out)}")
    print(f"inspect logs: {out} (inspect view --log-dir {out})")


def _reference(runs: list[Run], out: Path, dataset: str | None) -> None:
    for run in runs:
        attach_specs(run, dataset, required=True)  # the official format carries the spec's texts
    check_destination(out, "export.out")
    for run in runs:
        folder = out / run.key
        notes = write_reference_folder(run.results, run.specs, folder)
        print(f"{run.label}: {folder}")
        for note in notes:
            print(f"  {note}")
    print(f"official result folders: {out} (mode=report runs=[{out}/<run>] reads one back)")


def main(cfg: RunConfig, raw: dict) -> int:
    require_finished(cfg.runs)
    runs = runs_of(cfg)
    fmt = cfg.export.format
    out = Path(cfg.export.out).expanduser() if cfg.export.out else default_out(cfg, runs, fmt)
    if fmt == "inspect":
        _inspect(runs, out)
    else:
        _reference(runs, out, cfg.report.dataset)
    return 0
