"""Reading plant directories (mode=plant's output) for their figures: each one auditor's verdicts on the items
planted into one run, checked as a run's results are (seal, identity, spec hashes)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..protocol.plant import PlantResult
from ..rundir.layout import MANIFEST, RESULTS, read_manifest
from ..rundir.seals import check_result
from .plants import AuditorFigures, PairedComparison, compare_auditors, measure

PLANT_KIND = "plant"


@dataclass(frozen=True)
class PlantDir:
    path: Path
    label: str  # the judged auditor, as the manifest names it
    plants: str  # the items' digest
    source: str  # the planted run's identity (its path when it has none)
    manifest: dict[str, Any]
    results: tuple[PlantResult, ...]
    damaged: tuple[str, ...] = ()


def is_plant_dir(path: str | Path) -> bool:
    manifest = Path(path).expanduser() / MANIFEST
    return manifest.is_file() and read_manifest(manifest).get("kind") == PLANT_KIND


def load_plant_dir(path: str | Path) -> PlantDir:
    root = Path(path).expanduser()
    if not is_plant_dir(root):
        raise InputError(root, "runs", "not a plant directory (mode=plant writes one, with manifest kind `plant`)")
    manifest = read_manifest(root / MANIFEST)
    results, damaged = [], []
    for f in sorted((root / RESULTS).glob("*.json")):
        rec, problem = check_result(f, manifest, PlantResult)
        if rec is None:
            damaged.append(f"{f}: {problem}: not counted")
        else:
            results.append(rec)
    plants = manifest.get("plants") or {}
    return PlantDir(
        root,
        str(manifest.get("auditor_label") or root.name),
        str(plants.get("digest", "")),
        str((manifest.get("source") or {}).get("identity") or (manifest.get("source") or {}).get("path")),
        manifest,
        tuple(results),
        tuple(damaged),
    )


def distinct_labels(dirs: Sequence[PlantDir]) -> list[str]:
    """Each directory's auditor label, its folder name added where two would read the same."""
    labels = [d.label for d in dirs]
    return [f"{lab} ({d.path.name})" if labels.count(lab) > 1 else lab for lab, d in zip(labels, dirs, strict=True)]


def plant_figures(
    dirs: Sequence[PlantDir], resamples: int, seed: int, level: float
) -> tuple[list[AuditorFigures], list[PairedComparison], list[str]]:
    """Every auditor's figures, the paired differences of those judged on the first one's plants, and the
    notes a reader must see (damaged files, auditors on other plants, figures that measure nothing)."""
    labels = distinct_labels(dirs)
    figs = [
        measure(lab, str(d.path), d.plants, d.results, resamples, seed, level)
        for lab, d in zip(labels, dirs, strict=True)
    ]
    notes = [line for d in dirs for line in d.damaged]
    notes += [str(n) for d in dirs for n in d.manifest.get("notes") or ()]
    same = [(lab, d.results) for lab, d in zip(labels, dirs, strict=True) if d.plants == dirs[0].plants]
    others = [lab for lab, d in zip(labels, dirs, strict=True) if d.plants != dirs[0].plants]
    if others:
        notes.append(
            f"{', '.join(others)}: judged other plants than {labels[0]} (another run, draw or prompt): "
            "shown, not paired"
        )
    cmps = compare_auditors(same, resamples, seed, level)
    return figs, cmps, list(dict.fromkeys(notes))


def plant_rows(
    dirs: Sequence[PlantDir], points: Mapping[Path, str], resamples: int, seed: int, level: float
) -> list[dict[str, Any]]:
    """The analysis table `plants` (table_schema.PLANTS): every figure of every directory, one row each;
    `points`: each directory's sweep point, by its resolved path."""
    rows = []
    for lab, d in zip(distinct_labels(dirs), dirs, strict=True):
        fig = measure(lab, str(d.path), d.plants, d.results, resamples, seed, level)
        for s in fig.shares:
            measure_of, _, ctype = s.figure.key.partition(":")
            value, lo, hi = (None if math.isnan(x) else x for x in (s.value, s.lo, s.hi))
            rows.append(
                {
                    "run": d.path.name,
                    "label": lab,
                    "point": points.get(d.path.resolve()),
                    "plant_dir": str(d.path),
                    "source": d.source,
                    "plants": d.plants,
                    "figure": s.figure.key,
                    "measure": measure_of,
                    "conflict_type": ctype or None,
                    "hits": s.hits,
                    "items": s.items,
                    "stories": s.stories,
                    "value": value,
                    "value_lo": lo,
                    "value_hi": hi,
                    "level": level,
                    "resamples": resamples,
                    "seed": seed,
                }
            )
    return rows
