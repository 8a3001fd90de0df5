"""`mode=export`: finished runs as logs another tool reads; `export.format=inspect` writes one Inspect
`.eval` log per run (report/inspect_log.py), which `inspect view --log-dir DIR` lists and opens."""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..execution.layout import require_finished
from ..execution.store import check_destination
from ..report import default_out, runs_of
from ..report.inspect_log import build_log, write_log


def main(cfg: RunConfig, raw: dict) -> int:
    require_finished(cfg.runs)
    runs = runs_of(cfg)
    out = Path(cfg.export.out).expanduser() if cfg.export.out else default_out(cfg, runs, "inspect")
    logs = [build_log(run) for run in runs]  # every log builds (inspect_ai is there) before a file is written
    check_destination(out, "export.out")
    for run, log in zip(runs, logs, strict=True):
        print(f"{run.label}: {write_log(log, run, out)}")
    print(f"inspect logs: {out} (inspect view --log-dir {out})")
    return 0
