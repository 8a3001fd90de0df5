"""The analysis tables as Arrow tables and Parquet files (pyarrow).

`build_tables` turns runs into one Arrow table per schema of `table_schema.py` (several runs go into one
set, told apart by their key columns; plant directories give the `plants` table); `write_tables` writes
`<out>/<table>.parquet`; `read_tables` reads them back and refuses a file whose table or schema version
is not the one this rig writes.

Exports written before 2026-12-05 named a story's trial k > 0 `<spec>#<k>` in the `episode` column, where
the run directory, the report and every other export say `<spec>~t<k>` (protocol/trials.py); reading
such a file gives the one spelling, rebuilt from its `spec_id` and `trial` columns.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..protocol.trials import episode_name
from .plant_dirs import PlantDir, plant_rows
from .run_table import DEFAULT_BOOTSTRAP, Bootstrap, run_row
from .table_rows import Row, Source, run_rows
from .table_schema import META_TABLE, META_VERSION, TABLES, TableSchema

SUFFIX = ".parquet"


def table_path(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}{SUFFIX}"


def to_arrow(schema: TableSchema, rows: Sequence[Row]) -> pa.Table:
    """Rows as a table of exactly the schema's columns and types (a missing key is null)."""
    return pa.Table.from_pylist(list(rows), schema=schema.arrow())


def build_tables(
    sources: Iterable[Source],
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
    plants: Sequence[PlantDir] = (),
    points: Mapping[Path, str] | None = None,
) -> dict[str, pa.Table]:
    """Every table over all the runs, in the order given; `boot`: how the `runs` and `plants` tables'
    intervals are drawn; `plants`: plant directories (mode=plant), with their sweep `points`."""
    rows: dict[str, list[Row]] = {name: [] for name in TABLES}
    for src in sources:
        for name, part in run_rows(src).items():
            rows[name] += part
        rows["runs"].append(run_row(src, boot))
    rows["plants"] = plant_rows(plants, points or {}, boot.resamples, boot.seed, boot.level)
    return {name: to_arrow(TABLES[name], rows[name]) for name in TABLES}


def write_tables(tables: dict[str, pa.Table], out: Path) -> list[Path]:
    """`<out>/<table>.parquet` for each table; each file appears whole (written aside, then renamed)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, table in tables.items():
        path = table_path(out, name)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
        written.append(path)
    return written


def read_table(folder: Path, name: str) -> pa.Table:
    """One table from a folder the export wrote, checked against its schema's name and version."""
    path = table_path(folder, name)
    if not path.is_file():
        raise InputError(path, "runs", f"no {name} table here (mode=export export.format=parquet writes it)")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(path, "runs", f"cannot read the Parquet file: {exc}".splitlines()[0]) from None
    meta = table.schema.metadata or {}
    schema = TABLES[name]
    if meta.get(META_TABLE) != name.encode() or meta.get(META_VERSION) != str(schema.version).encode():
        got = (meta.get(META_TABLE) or b"?").decode(), (meta.get(META_VERSION) or b"?").decode()
        raise InputError(
            path,
            "runs",
            f"table {got[0]} schema version {got[1]}, this rig reads {name} version {schema.version}: "
            "export the runs again",
        )
    return _one_spelling(table)


OLD_SEPARATOR = "#"  # the `episode` column's trial separator before the one name (module docstring)


def _one_spelling(table: pa.Table) -> pa.Table:
    """The table with its `episode` column named as the episode's files are (`movie48~t2`, not `movie48#2`)."""
    if "episode" not in table.column_names:
        return table
    episodes = table.column("episode").to_pylist()
    if not any(OLD_SEPARATOR in (e or "") for e in episodes):
        return table
    stories, trials = table.column("spec_id").to_pylist(), table.column("trial").to_pylist()
    names = [
        episode_name(s, t) if s is not None and t is not None else e
        for e, s, t in zip(episodes, stories, trials, strict=True)
    ]
    i = table.column_names.index("episode")
    return table.set_column(i, table.schema.field(i), pa.array(names, pa.string()))


def is_table_folder(folder: Path) -> bool:
    """A folder the Parquet export wrote (it holds the episodes table)."""
    return table_path(folder, "episodes").is_file()
