"""The analysis tables as pandas DataFrames, for a researcher's own questions.

    from ncp_local import analysis
    eps = analysis.episodes("runs/ncp_bench-1a2b3c")          # a run directory
    turns = analysis.turns(["runs/a", "runs/b"])               # several runs: `run`/`label` columns
    sweep = analysis.episodes("multirun/2026-12-04/10-00-00")  # a sweep folder: a `point` column too
    calls = analysis.calls("runs/a/parquet")                   # or the files mode=export wrote
    auditors = analysis.plants(["runs/plant-a-1", "runs/plant-a-2"])  # mode=plant's figures, one row each

Each loader returns one table of `ncp_local.report.table_schema` (columns and meaning: the docs' analysis
tables reference): from run directories it builds the table as `mode=export export.format=parquet` would
write it, so both ways give the same frame. Reads only; imports no mode. See docs/guide/analysis.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..report.parquet import build_tables, is_table_folder, read_table, table_path, to_arrow
from ..report.plant_dirs import is_plant_dir, load_plant_dir
from ..report.runs import attach_specs, expand_runs, load_runs, sweep_points
from ..report.table_rows import Source, point_of
from ..report.table_schema import TABLES

__all__ = ["TABLES", "calls", "conflicts", "episodes", "ledger_events", "plants", "runs", "tables", "turns"]

Runs = str | Path | Sequence[str | Path]


def _entries(runs: Runs) -> list[str]:
    return [str(runs)] if isinstance(runs, str | Path) else [str(r) for r in runs]


def tables(
    runs: Runs, names: Sequence[str] = tuple(TABLES), label: str | None = None, dataset: str | None = None
) -> dict[str, pd.DataFrame]:
    """The named tables (all seven by default) of run directories, plant directories (the `plants` table),
    sweep folders, globs, or one folder of Parquet files the export wrote. `label`: a row-label template as
    `report.label`; `dataset`: where the specs are when the run's manifest points elsewhere (`report.dataset`)."""
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        raise KeyError(f"no table {unknown[0]!r} (tables: {', '.join(TABLES)})")
    entries = _entries(runs)
    if len(entries) == 1 and is_table_folder(Path(entries[0]).expanduser()):
        folder = Path(entries[0]).expanduser()
        # An export from before the `plants` table has no file of it: it exported no plant directory.
        empty = {"plants": to_arrow(TABLES["plants"], [])} if not table_path(folder, "plants").is_file() else {}
        return {n: (empty[n] if n in empty else read_table(folder, n)).to_pandas() for n in names}
    given = expand_runs(entries)
    run_dirs = [p for p in given if not is_plant_dir(p)]
    loaded = load_runs(run_dirs, label) if run_dirs else []
    for run in loaded:
        attach_specs(run, dataset)
    points = sweep_points(entries)
    plant_dirs = [load_plant_dir(p) for p in given if is_plant_dir(p)]
    built = build_tables((Source(run, point_of(run.path, points)) for run in loaded), plants=plant_dirs, points=points)
    return {n: built[n].to_pandas() for n in names}


def episodes(runs: Runs, label: str | None = None, dataset: str | None = None) -> pd.DataFrame:
    """One row per finished episode: termination, turns, trajectory and satisfied shares, genres, counts."""
    return tables(runs, ("episodes",), label, dataset)["episodes"]


def turns(runs: Runs, label: str | None = None, dataset: str | None = None) -> pd.DataFrame:
    """One row per turn record: its conflict, facts added and negated, node, statuses, tokens."""
    return tables(runs, ("turns",), label, dataset)["turns"]


def calls(runs: Runs, label: str | None = None, dataset: str | None = None) -> pd.DataFrame:
    """One row per line of the call logs: stage, role, attempt, tokens, latency, outcome."""
    return tables(runs, ("calls",), label, dataset)["calls"]


def ledger_events(runs: Runs, label: str | None = None, dataset: str | None = None) -> pd.DataFrame:
    """One row per committed change: a fact added or negated, a node reached, a commitment's status."""
    return tables(runs, ("ledger_events",), label, dataset)["ledger_events"]


def conflicts(runs: Runs, label: str | None = None, dataset: str | None = None) -> pd.DataFrame:
    """One row per conflict an audit raised, with the double-check's verdict and whether it stood."""
    return tables(runs, ("conflicts",), label, dataset)["conflicts"]


def runs(runs: Runs, label: str | None = None, dataset: str | None = None) -> pd.DataFrame:
    """One row per run: the report's main table (avg turns, turns kept, rates), each with its interval."""
    return tables(runs, ("runs",), label, dataset)["runs"]


def plants(runs: Runs, label: str | None = None, dataset: str | None = None) -> pd.DataFrame:
    """One row per figure of an auditor measured on planted contradictions (plant directories, mode=plant):
    recall, the type and the id named right per conflict type, false alarms, each with its interval."""
    return tables(runs, ("plants",), label, dataset)["plants"]
