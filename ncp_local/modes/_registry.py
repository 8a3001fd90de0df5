"""The modes, listed once in `MODES`: each with its one-line help and its module, imported when it runs."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ..config import ConfigError, RunConfig
from ..config.suggest import closest

# The package the mode modules are in (ncp_local.modes): a mode's module is its name there.
_PACKAGE = __name__.rpartition(".")[0]


@dataclass(frozen=True)
class Mode:
    name: str
    help: str  # one line, for --help and the docs' modes reference
    # The config keys naming what the mode writes (a folder, or a file: execution/places.FILE_KEYS):
    # each one the config sets is checked at the entry (modes/_dispatch.py), before any model loads.
    writes: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return f"{_PACKAGE}.{self.name}"

    def load(self) -> Callable[[RunConfig], int]:
        # Imported on use: a mode's heavy dependencies (vllm, matplotlib) load only when it runs.
        return importlib.import_module(self.module).main


MODES: tuple[Mode, ...] = (
    Mode(
        "run",
        "play episodes and write a run directory (the default; the same command resumes)",
        ("out_dir", "tracker.dir"),
    ),
    Mode("plan", "will the config fit its GPUs and windows? memory shares, devices, prompt growth (no model loads)"),
    Mode("lint", "check a dataset (dataset.path=DIR) and print its counts"),
    Mode("build", "specs from synopses: sources=FILE.yaml out=DIR", ("out",)),
    Mode(
        "bench",
        "throughput of the rig vs one call at a time; bench.sweep={...}: a sweep batched vs point by point",
        ("out_dir",),
    ),
    Mode(
        "report",
        "tables, survival plot, HTML: runs=[DIR,...], a glob (runs/local-*) or a sweep folder",
        ("report.out",),
    ),
    Mode(
        "compare",
        "runs=[BASELINE,RUN,...]: each figure's difference from the first run, paired by story, with its p-value "
        "and the smallest difference the design finds; compare.paper=<row>: the paper's figures beside a run",
        ("report.out",),
    ),
    Mode(
        "reaudit",
        "judge a run's turns again with another auditor: runs=[DIR] (written beside DIR as "
        "`reaudit-<run>-<config hash>`, or into `out_dir`); several re-audits: the auditor table",
        ("out_dir", "report.out"),
    ),
    Mode(
        "plant",
        "an auditor against contradictions of known truth planted into a run's clean turns: runs=[DIR] (written "
        "beside DIR as `plant-<run>-<identity>`, or into `out_dir`): recall per type, false alarms, intervals by "
        "story; several plant directories: side by side, paired",
        ("out_dir", "report.out"),
    ),
    Mode("review", "a human review sheet of conflict terminations (review.sheet=CSV reads it back)", ("review.out",)),
    Mode("merge", "join a sharded run's shards: out_dir=DIR", ("out_dir",)),
    Mode("rerun", "repeat a finished run from its manifest: from=DIR (out_dir defaults to <DIR>-rerun)", ("out_dir",)),
    Mode(
        "export",
        "runs as files other tools read: runs=[DIR,...] export.format=inspect, one Inspect `.eval` per run "
        "(`inspect view --log-dir DIR`; export.events=false leaves the per-call events out); "
        "export.format=parquet, the analysis tables (episodes, turns, calls, ledger_events, conflicts) over "
        "all the runs; export.format=reference, the official NCP-Bench result files, a folder per run; "
        "into `<first run>/<format>` or `export.out`",
        ("export.out",),
    ),
    Mode(
        "submission",
        "runs=[DIR,...] packed into one verifiable archive (submission=FILE, default <first run>/submission.tar.gz) "
        "with computed flags official_prompts/official_dataset/complete/verified",
        ("submission",),
    ),
    Mode(
        "status",
        "where each run, shard and sweep point stands: runs=[DIR,...] (a sharded run, a sweep folder, a glob); "
        "state, episodes, turns, calls/s, ETA; status.format=json, status.watch=S; reads only files (and Slurm)",
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
