"""The modes, listed once in `MODES`: each with its one-line help and its module, imported when it runs."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import ConfigError, RunConfig
from ..config.suggest import closest

# The package the mode modules are in (ncp_local.modes): a mode's module is its name there.
_PACKAGE = __name__.rpartition(".")[0]


@dataclass(frozen=True)
class Mode:
    name: str
    help: str  # one line, for --help and the docs' modes reference

    @property
    def module(self) -> str:
        return f"{_PACKAGE}.{self.name}"

    def load(self) -> Callable[[RunConfig, dict[str, Any]], int]:
        # Imported on use: a mode's heavy dependencies (vllm, matplotlib) load only when it runs.
        return importlib.import_module(self.module).main


MODES: tuple[Mode, ...] = (
    Mode("run", "play episodes and write a run directory (the default; the same command resumes)"),
    Mode("plan", "will the config fit its GPUs and windows? memory shares, devices, prompt growth (no model loads)"),
    Mode("lint", "check a dataset (dataset.path=DIR) and print its counts"),
    Mode("build", "specs from synopses: sources=FILE.yaml out=DIR"),
    Mode("bench", "throughput of the rig vs one call at a time; bench.sweep={...}: a sweep batched vs point by point"),
    Mode("report", "tables, survival plot, HTML: runs=[DIR,...], a glob (runs/local-*) or a sweep folder"),
    Mode(
        "compare",
        "runs=[BASELINE,RUN,...]: each figure's difference from the first run, paired by story, with its p-value "
        "and the smallest difference the design finds; compare.paper=<row>: the paper's figures beside a run",
    ),
    Mode(
        "reaudit",
        "judge a run's turns again with another auditor: runs=[DIR] (written beside DIR as "
        "`reaudit-<run>-<config hash>`, or into `out_dir`); several re-audits: the auditor table",
    ),
    Mode("review", "a human review sheet of conflict terminations (review.sheet=CSV reads it back)"),
    Mode("merge", "join a sharded run's shards: out_dir=DIR"),
    Mode("rerun", "repeat a finished run from its manifest: from=DIR (out_dir defaults to <DIR>-rerun)"),
    Mode(
        "export",
        "runs as files other tools read: runs=[DIR,...] export.format=inspect, one Inspect `.eval` per run "
        "(`inspect view --log-dir DIR`; export.events=false leaves the per-call events out); "
        "export.format=parquet, the analysis tables (episodes, turns, calls, ledger_events, conflicts) over "
        "all the runs; export.format=reference, the official NCP-Bench result files, a folder per run; "
        "into `<first run>/<format>` or `export.out`",
    ),
    Mode(
        "submission",
        "runs=[DIR,...] packed into one verifiable archive (submission=FILE, default <first run>/submission.tar.gz) "
        "with computed flags official_prompts/official_dataset/complete/verified",
    ),
    Mode("validate", "check a submission archive: submission=FILE (seals, hashes, every metric and flag recomputed)"),
)
BY_NAME: dict[str, Mode] = {m.name: m for m in MODES}


def find(name: str) -> Mode:
    if name not in BY_NAME:
        near = closest(name, BY_NAME)
        hint = f"did you mean {near}?" if near else f"known: {', '.join(BY_NAME)}"
        raise ConfigError("mode", f"unknown mode {name!r} ({hint})")
    return BY_NAME[name]
