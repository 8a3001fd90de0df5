"""Reports over finished runs: tables, survival plot, per-genre tables, cost by role and
stage, HTML transcripts, the human review sheet, the auditor agreement tables, and the
runs as Inspect logs (`inspect_log.py`, loaded only by `mode=export`).

Reads run directories only; never writes into a run's own files (the report
goes to `<first run>/report/` or `report.out`). May import protocol and execution, never a mode.

The package face: `build.py` writes a report (`build_report`); each section is a module of its own.
"""

from .build import build_report, default_out, files_listing, run_notes, runs_of
from .runs import Run, load_runs

__all__ = ["Run", "build_report", "default_out", "files_listing", "load_runs", "run_notes", "runs_of"]
