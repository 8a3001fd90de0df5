"""The figures of one `mode=bench` run, as a record: `bench.json` in the bench's run directory.

Written by every (default) bench run, read back by `scripts/bench_compare.py` to put two commits'
runs side by side. A record, not the printed table: the printed lines stay for people, this is
for tools (each way's raw counts, not only its rounded rates). `FORMAT` changes when a field's
meaning does.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FORMAT = "ncp-bench/1"
FILE = "bench.json"


class WayFigures(BaseModel):
    """One row of the bench table: one way of running the workload."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="a, b, c or d: the row's letter")
    name: str = Field(description="the row's label as printed")
    wall_s: float
    calls: int
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    prompt_tok_s: float
    cached_tok_s: float
    generated_tok_s: float
    total_tok_s: float
    turns_per_min: float | None = Field(None, description="None when the way plays no turns")
    overhead_ms: float | None = Field(None, description="the rig's median Python time per call; None for replays")
    in_flight: float = Field(description="mean calls in flight: summed latency / wall")


class Machine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu_model: str
    cores: int | None
    usable_cores: int | None = None


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    episodes: int
    turns: int
    sequential: bool
    sequential_episodes: int | None
    seed: int
    max_tokens: int
    engine: str
    model: str


class BenchFigures(BaseModel):
    """Everything one bench run measured, with what it ran on."""

    model_config = ConfigDict(extra="forbid")

    format: str = FORMAT
    commit: str = Field(description="the rig's git revision (`+dirty` when the tree had changes)")
    date: str = Field(description="UTC, ISO 8601, when the bench finished")
    machine: Machine
    vllm: str | None = Field(description="the installed vLLM's version (None: not installed)")
    workload: Workload
    ways: list[WayFigures]
    ratios: dict[str, float | None] = Field(description="the `ratios:` line's figures (None: not measured)")
    lines: list[str] = Field(description="the printed lines after the header, as printed")

    def way(self, key: str) -> WayFigures | None:
        return next((w for w in self.ways if w.key == key), None)

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.model_dump_json(indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, path: Path) -> BenchFigures:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))


def finite(x: float) -> float | None:
    """A ratio for JSON: NaN and infinities (not measured) become None."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def spread(values: Iterable[float]) -> dict[str, Any]:
    """Median, min, max and (max - min) / median of repeated measures; Nones are left out."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "spread": None}
    med = statistics.median(xs)
    return {"n": len(xs), "median": med, "min": xs[0], "max": xs[-1], "spread": (xs[-1] - xs[0]) / med if med else None}


def dumps(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True)
