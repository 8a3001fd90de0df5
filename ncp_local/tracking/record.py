"""What a tracker logs for one finished run, built from its run directory and nothing else.

The same figures as the report: the main table's metrics with their intervals (`tables.summary_record`,
the row of results.csv), S(t) with its band (`survival.csv`), the cost by role (the cost table summed over
stages), and the report folder itself, written where `mode=report` writes it by default. For a plant
directory (mode=plant): the auditor's figures as the `plants` analysis table has them (recall, the type
and the id named right per conflict type, false alarms), each with its interval and its items, and the
figures' files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..report import build_report
from ..report.cost import SUMS, Usage, cost_table
from ..report.plant_dirs import is_plant_dir, load_plant_dir, plant_rows
from ..report.runs import Run, attach_specs, load_run
from ..report.tables import summary_record, summary_rows

# The cost table's sums logged per role (report/cost.py's Usage fields).
COST_FIELDS = SUMS
# results.csv's text columns: the label and what ran go to the tags, never to the metrics.
NOT_METRICS = ("label", "run_dir", "engine", "narrator_model", "player_model", "auditor_model")


@dataclass(frozen=True)
class RunRecord:
    key: str  # the run directory's name
    name: str  # what the tracker calls the run: its sweep point, else its label
    config: dict[str, Any]  # the manifest's config (nested)
    tags: dict[str, str]  # identity, rig version, label, run directory, git revision, dataset digest
    metrics: dict[str, float]  # the main table's row: points, intervals, counts
    survival: list[tuple[int, float, float, float]]  # (turns played t, S(t), lo, hi)
    cost: dict[str, dict[str, float]]  # role -> the cost table's sums
    report: Path | None  # the report folder (None: not written)
    files: dict[str, str] = field(default_factory=dict)  # small text files to log: name -> content


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as `a.b.c -> value` strings (the form MLflow's params take)."""
    out: dict[str, str] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out |= flat(v, key + ".")
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return out


def run_record(cfg: RunConfig, run_dir: Path, point: str | None = None) -> RunRecord:
    """The run directory's figures, as `mode=report` would give them with this config's report settings."""
    if is_plant_dir(run_dir):
        return plant_record(cfg, run_dir, point)
    run: Run = load_run(run_dir)
    attach_specs(run, cfg.report.dataset)
    rep = cfg.report
    [row] = summary_rows([run], rep.resamples, rep.seed, rep.level, rep.horizon)
    record = summary_record(row)
    metrics = {k: float(v) for k, v in record.items() if k not in NOT_METRICS and v != ""}
    agg = row.agg
    survival = [(t, agg.survival[t], agg.survival_lo[t], agg.survival_hi[t]) for t in range(len(agg.survival))]
    by_role: dict[str, Usage] = {}
    for (role, _stage), usage in cost_table(run).rows.items():
        by_role.setdefault(role, Usage()).merge(usage)
    cost = {role: {f: float(getattr(u, f)) for f in COST_FIELDS} for role, u in sorted(by_role.items())}
    report = None
    if cfg.tracker.report:
        report = run.path / "report"
        build_report(
            [run], report, rep.resamples, rep.seed, rep.level, rep.html, rep.gpu_hour_cost, horizon=rep.horizon
        )
    m = run.manifest
    git = m.get("git") or {}
    tags = {
        "identity": str(m.get("identity") or ""),
        "rig_version": str(m.get("rig_version") or ""),
        "label": run.label,
        # What ran, as the manifest records it (report/ran.py): a scripted run is never mistaken for a model's.
        **{k: str(record[k]) for k in NOT_METRICS[2:]},
        "run_dir": str(run.path.resolve()),
        "git_revision": str(git.get("revision") or m.get("git_revision") or ""),
        "dataset_sha256": str((m.get("dataset") or {}).get("sha256") or ""),
    }
    return RunRecord(
        key=run.key,
        name=point or run.label,
        config=dict(m.get("config") or {}),
        tags={k: v for k, v in tags.items() if v},
        metrics=metrics,
        survival=survival,
        cost=cost,
        report=report,
        files={"versions.json": json.dumps(m.get("versions") or {}, indent=2)},
    )


PLANT_FILES = ("plants.md", "plants.csv")


def plant_record(cfg: RunConfig, plant_dir: Path, point: str | None = None) -> RunRecord:
    """A plant directory's figures: per figure of the `plants` table, `<figure>` (`recall:fact` logged as
    `recall_fact`), its interval's ends `<figure>_lo` / `_hi`, and the items it counts, `<figure>_items`."""
    d = load_plant_dir(plant_dir)
    rep = cfg.report
    metrics: dict[str, float] = {"judged": float(sum(len(r.items) for r in d.results))}
    for row in plant_rows([d], {}, rep.resamples, rep.seed, rep.level):
        name = str(row["figure"]).replace(":", "_")
        ends = {name: row["value"], f"{name}_lo": row["value_lo"], f"{name}_hi": row["value_hi"]}
        metrics |= {k: float(v) for k, v in ends.items() if v is not None}
        metrics[f"{name}_items"] = float(row["items"])
    m = d.manifest
    git = m.get("git") or {}
    tags = {
        "kind": "plant",
        "identity": str(m.get("identity") or ""),
        "rig_version": str(m.get("rig_version") or ""),
        "label": d.label,
        "run_dir": str(d.path.resolve()),
        "source": d.source,
        "plants": d.plants,
        "git_revision": str(git.get("revision") or ""),
    }
    return RunRecord(
        key=d.path.name,
        name=point or d.label,
        config=dict(m.get("config") or {}),
        tags={k: v for k, v in tags.items() if v},
        metrics=metrics,
        survival=[],
        cost={},
        report=None,
        files={n: (d.path / n).read_text() for n in PLANT_FILES if (d.path / n).is_file()},
    )
