"""The `runs` analysis table's row: one run's main-table figures (results.csv's row), with their intervals.

The row is `tables.summary_record` under the schema's names (`table_schema.RUNS`), so the Parquet table,
results.csv and the trackers give the same figures: avg turns beside turns kept (the restricted mean),
each with the report's story-bootstrap interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from .table_rows import Row, Source
from .tables import summary_record, summary_rows


@dataclass(frozen=True)
class Bootstrap:
    """How the intervals are drawn: `report.resamples`, `report.seed`, `report.level`, `report.horizon`."""

    resamples: int = 2000
    seed: int = 0
    level: float = 0.95
    horizon: int | None = None


DEFAULT_BOOTSTRAP = Bootstrap()  # the report's defaults (conf/config.yaml's report section)


def run_row(src: Source, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> Row:
    [row] = summary_rows([src.run], boot.resamples, boot.seed, boot.level, boot.horizon)
    rec = summary_record(row)
    # results.csv leaves a missing interval blank; the table's null says the same.
    figures = {k: (None if v == "" else v) for k, v in rec.items() if k not in ("label", "run_dir")}
    return {
        "run": src.run.key,
        "label": src.run.label,
        "point": src.point,
        "run_dir": rec["run_dir"],
        "turn_cap": src.run.max_turns,
        **figures,
        "level": boot.level,
        "resamples": boot.resamples,
        "seed": boot.seed,
    }
