"""Reading finished runs for reports: one run dir, or the shards of one run.

A run dir holds `results/`; a Slurm run holds `shard-XXX-of-YYY/` subdirs,
each a run dir of its own, and is read as one run (the union of the shards'
results). Nothing here writes into a run dir.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..bindings import ran_no_model
from ..config import SCRIPTED
from ..errors import InputError
from ..protocol.metrics import Aggregate, EpisodeMetrics, aggregate, episode_metrics
from ..protocol.records import EpisodeResult
from ..protocol.spec import Spec, dataset_digest, load_spec, parse_yaml, text_bytes
from ..rundir.layout import CHECKPOINTS, MANIFEST, RESULTS, SHARD, read_manifest
from ..rundir.seals import check_result
from ..rundir.sweep_index import read_index
from ..rundir.turn_log import checkpoint_paths
from .labels import SHORT, by_difference, from_template, short_names
from .reference_runs import REFERENCE_KIND, looks_like_reference, read_reference_folder

REAUDIT_KIND = "reaudit"
# The note on unfinished episodes a mode leaves out (a report that counts them drops it: report/in_flight.py).
LEFT_OUT = "unfinished (checkpoint, no result): left out"


@dataclass
class Run:
    path: Path
    label: str
    manifest: dict[str, Any]
    # episode name (protocol/trials.py: the spec id for trial 0) -> result, in dataset order, a story's
    # trials together in trial order
    results: dict[str, EpisodeResult]
    shards: tuple[Path, ...] = ()
    unfinished: tuple[str, ...] = ()  # a checkpoint but no result yet
    # The unfinished episodes a report counts, censored at their last committed turn (report/in_flight.py;
    # empty unless it did): in S(t) and the curves, never in the per-episode averages.
    in_flight: tuple[EpisodeMetrics, ...] = ()
    notes: list[str] = field(default_factory=list)
    damaged: tuple[tuple[Path, str], ...] = ()  # result files that failed their check, and why: not counted
    specs: dict[str, Spec] = field(default_factory=dict)  # filled by `attach_specs`
    # The report's bootstrap (resamples, seed): every interval of this run's report draws with it.
    bootstrap: tuple[int, int] = (2000, 0)
    # The settings that tell this run apart in full (`condition.name=natural seed=0`), where its label is
    # the short name (`condition=natural`): said once, in the legend.
    overrides: str = ""
    # Aggregates by (level, bootstrap): a run with trials bootstraps its S(t) band, and the report's
    # tables, plots and sections all read the same one.
    _aggregates: dict[tuple[float, int, int], Aggregate] = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> str:
        return self.path.name or "run"

    @property
    def max_turns(self) -> int:
        cfg_turns = (self.manifest.get("config") or {}).get("max_turns")
        turns = [r.max_turns for r in self.results.values()]
        return max(turns) if turns else int(cfg_turns or 0)

    def metrics(self) -> list[EpisodeMetrics]:
        return [episode_metrics(r) for r in self.results.values()]

    def aggregate(self, level: float = 0.95) -> Aggregate:
        key = (level, *self.bootstrap)
        if key not in self._aggregates:
            self._aggregates[key] = aggregate(
                self.metrics(), self.max_turns, level, *self.bootstrap, in_flight=self.in_flight
            )
        return self._aggregates[key]

    def forget_aggregates(self) -> None:
        """Drop the aggregates computed so far (what they count has changed)."""
        self._aggregates.clear()

    def genres(self, spec_id: str) -> tuple[str, ...]:
        spec = self.specs.get(spec_id)
        return spec.meta.genres if spec else ()


def _read_result(path: Path, manifest: dict[str, Any]) -> tuple[EpisodeResult | None, str]:
    # The store's own check against the run's manifest (seal, spec id, run
    # identity, a spec of its dataset, record hash); nothing is moved. An
    # unsealed result is still read from a run of an older rig.
    return check_result(path, manifest)


def role_label(manifest: dict[str, Any], role: str) -> str | None:
    """What played `role` in a run, as its manifest records it: the model's name, `scripted` when no
    model ran (never the name a config left in place), None when the manifest does not say."""
    cfg = manifest.get("config") or {}
    if ran_no_model(cfg, role):
        return SCRIPTED
    name = ((cfg.get(role) or {}).get("model") or {}).get("name")
    return name or ((manifest.get("models") or {}).get(role) or {}).get("name")


def label_from_manifest(manifest: dict[str, Any], fallback: str) -> str:
    """narrator model / auditor model / condition / method, as far as the manifest knows."""
    cfg = manifest.get("config") or {}
    parts = [
        role_label(manifest, "narrator"),
        role_label(manifest, "auditor"),
        (cfg.get("condition") or {}).get("name"),
        (cfg.get("method") or {}).get("name"),
    ]
    if not all(parts[:2]):
        return fallback
    return " / ".join(str(p) for p in parts if p)


def in_dataset_order(found: dict[str, EpisodeResult], manifest: dict[str, Any]) -> dict[str, EpisodeResult]:
    """Results in the order of the run's dataset index (others after, by id): the order the bootstrap
    resamples, so anyone recomputing a run's intervals gets the same ones."""
    order = list((manifest.get("dataset") or {}).get("specs") or [])
    rank = {sid: i for i, sid in enumerate(order)}
    # A story's trials together, trial 0 first (keyed by episode name: protocol/trials.py).
    return dict(sorted(found.items(), key=lambda kv: (rank.get(kv[1].spec_id, len(rank)), kv[1].spec_id, kv[1].trial)))


def load_run(path: str | Path) -> Run:
    root = Path(path).expanduser()
    if not root.is_dir():
        raise InputError(root, "runs", "no such run directory")
    shards = sorted(
        (d for d in root.iterdir() if d.is_dir() and SHARD.match(d.name) and (d / RESULTS).is_dir()),
        key=lambda d: d.name,
    )
    parts = ([root] if (root / RESULTS).is_dir() else []) + shards
    if not parts and looks_like_reference(root):
        return _reference_run(root)
    if not parts:
        raise InputError(
            root,
            "runs",
            "not a run directory (no results/ and no shard-XXX-of-YYY/results/) nor a folder of official result files",
        )
    manifest: dict[str, Any] = {}
    for part in parts:
        if (part / MANIFEST).is_file():
            manifest = read_manifest(part / MANIFEST)
            break
    if manifest.get("kind") == REAUDIT_KIND:
        raise InputError(root, "runs", "this is a re-audit directory; its report is agreement.md in it")
    notes: list[str] = []
    if shards:
        counts = {int(SHARD.match(d.name).group(2)) for d in shards}  # type: ignore[union-attr]
        present = {int(SHARD.match(d.name).group(1)) for d in shards}  # type: ignore[union-attr]
        if len(counts) > 1:
            notes.append(f"shard dirs of different shard counts: {sorted(counts)}")
        missing = sorted(set(range(max(counts))) - present)
        if missing:
            notes.append(
                f"{len(present)} of {max(counts)} shards present (missing "
                + ", ".join(f"{i:03d}" for i in missing)
                + ")"
            )
    found: dict[str, EpisodeResult] = {}
    unfinished: set[str] = set()
    damaged: list[tuple[Path, str]] = []
    # Checkpoints listed before results: an episode finishing meanwhile (result written, then its
    # checkpoint dropped) is still found by its result, never lost between the two listings.
    for part in parts:
        if (part / CHECKPOINTS).is_dir():
            unfinished.update(checkpoint_paths(part / CHECKPOINTS))
    for part in parts:
        for f in sorted((part / RESULTS).glob("*.json")):
            result, why = _read_result(f, manifest)
            if result is None:
                notes.append(f"{f}: {why}: not counted")  # a failing file is named, never counted
                damaged.append((f, why))
                continue
            if result.episode in found:
                notes.append(f"{result.episode}: result in more than one shard; kept the first ({f} ignored)")
                continue
            found[result.episode] = result
    unfinished -= set(found)
    ordered = in_dataset_order(found, manifest)
    if unfinished:
        notes.append(f"{len(unfinished)} episode(s) {LEFT_OUT}")
    return Run(
        path=root,
        label=label_from_manifest(manifest, root.name),
        manifest=manifest,
        results=ordered,
        shards=tuple(shards),
        unfinished=tuple(sorted(unfinished)),
        notes=notes,
        damaged=tuple(damaged),
    )


def _reference_run(root: Path) -> Run:
    """A folder the official code wrote, as a run (its notes say what it lacks)."""
    folder = read_reference_folder(root)
    return Run(
        path=root,
        label=label_from_manifest(folder.manifest, root.name),
        manifest=folder.manifest,
        results=folder.results,
        unfinished=folder.unfinished,
        notes=folder.notes,
    )


GLOB_CHARS = set("*?[")


def is_sweep_folder(root: Path) -> bool:
    """A sweep's folder (hydra.sweep.dir with the sweep's index), not a run directory."""
    return root.is_dir() and not (root / RESULTS).is_dir() and any(root.glob("index*.json"))


def expand_runs(paths: list[str]) -> list[str]:
    """`runs=` entries as run directories: a glob (`runs/local-*`) is its matching directories, a sweep
    folder (holding the sweep's index.json) the run directories of its points; anything else as given."""
    out: list[str] = []
    for entry in paths:
        root = Path(entry).expanduser()
        if GLOB_CHARS & set(str(entry)):
            anchor = Path(root.anchor) if root.is_absolute() else Path(".")
            pattern = str(root.relative_to(root.anchor)) if root.is_absolute() else str(root)
            found = sorted(str(p) for p in anchor.glob(pattern) if p.is_dir())
            if not found:
                raise InputError(entry, "runs", "no directory matches this pattern")
            out += expand_runs(found)
            continue
        if is_sweep_folder(root):
            rows = read_index(root)
            dirs = [r.run_dir for r in rows if r.run_dir and Path(r.run_dir).is_dir()]
            if not dirs:
                raise InputError(root, "runs", "a sweep folder whose points have no run directory yet")
            out += list(dict.fromkeys(dirs))  # shards of one sweep list each point once per shard index
            continue
        out.append(entry)  # as given, even twice (a run compared with itself stays two rows)
    return out


def sweep_points(paths: list[str]) -> dict[Path, str]:
    """The sweep point of each run directory that `runs=` names through a sweep folder: its resolved path ->
    the overrides that tell its point from the sweep's others, as one string (`narrator.temperature=0.2
    seed=1`; the overrides every point shares are left out)."""
    out: dict[Path, str] = {}
    for entry in paths:
        root = Path(entry).expanduser()
        if GLOB_CHARS & set(str(entry)) or not is_sweep_folder(root):
            continue
        rows = [r for r in read_index(root) if r.run_dir]
        shared = set.intersection(*(set(r.overrides) for r in rows)) if rows else set()
        for row in rows:
            own = [o for o in row.overrides if o not in shared]
            out.setdefault(Path(str(row.run_dir)).expanduser().resolve(), " ".join(own))
    return out


def load_runs(paths: list[str], label: str | None = None) -> list[Run]:
    """The runs to compare, each labelled by what differs between them (or by the `label` template)."""
    runs = [load_run(p) for p in expand_runs(paths)]
    # A folder of official result files records next to no config: it keeps its own label
    # (`official: <models or folder>`) rather than being told apart by keys it does not have.
    rig = [r for r in runs if r.manifest.get("kind") != REFERENCE_KIND]
    for r in runs:
        if r.manifest.get("kind") == REFERENCE_KIND:
            r.label = f"official: {r.label}"
    configs = [r.manifest.get("config") or {} for r in rig]
    named = [from_template(label, c) for c in configs] if label else by_difference(configs)
    if named:
        for r, name in zip(rig, named, strict=True):
            r.label = name
    # Labels too long for a table's first column (a sweep's point names fit): each run named by what sets it
    # apart from the first instead, the full label once, in the legend.
    if named and not label and max(map(len, named)) > SHORT:
        for r, name in zip(runs, short_names(runs), strict=True):
            if r.manifest.get("kind") != REFERENCE_KIND:
                r.overrides, r.label = r.label, name
    # Runs of the same models and condition (other seeds, say) still need a
    # row each that a reader can tell apart.
    labels = [r.label for r in runs]
    for r in runs:
        if labels.count(r.label) > 1:
            r.label = f"{r.label} [{r.key}]"
    labels = [r.label for r in runs]
    for i, r in enumerate(runs):
        if labels.count(r.label) > 1:
            r.label = f"{r.label} #{i + 1}"
    return runs


def _dataset_digest(root: Path) -> str | None:
    """The same digest as `spec.load_dataset` (index, then each spec in index order)."""
    index = root / "index.yaml"
    try:
        data = text_bytes(index.read_bytes())
        ids = (parse_yaml(data.decode("utf-8")) or {}).get("specs") or []
        return dataset_digest(data, (text_bytes((root / "specs" / f"{sid}.yaml").read_bytes()) for sid in ids))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError, TypeError):
        return None


def attach_specs(run: Run, dataset: str | None = None, required: bool = False) -> None:
    """Load the specs of the run's episodes (for genres, ledgers, targets).

    The dataset path is the manifest's unless `dataset` overrides it. With
    `required`, a missing spec is an error; otherwise a note, and what needs
    the spec is left out of the report for that episode.
    """
    where = dataset or (run.manifest.get("dataset") or {}).get("path")
    if not where:
        msg = "the manifest names no dataset (pass report.dataset=DIR)"
        if required:
            raise InputError(run.path / MANIFEST, "dataset.path", msg)
        run.notes.append(f"specs not loaded: {msg}")
        return
    root = Path(where).expanduser()
    expected = (run.manifest.get("dataset") or {}).get("sha256")
    if expected and root.is_dir():
        got = _dataset_digest(root)
        if got and got != expected:
            run.notes.append(
                f"dataset at {root} differs from the one the run used (sha256 {got[:12]} != {expected[:12]})"
            )
    missing = []
    for sid in dict.fromkeys(r.spec_id for r in run.results.values()):  # each story once, whatever its trials
        path = root / "specs" / f"{sid}.yaml"
        if not path.is_file():
            missing.append(sid)
            continue
        run.specs[sid] = load_spec(path)
    if missing:
        msg = f"{len(missing)} spec(s) not found under {root}/specs: {', '.join(missing[:5])}"
        if required:
            raise InputError(root, "dataset.path", msg + " (pass report.dataset=DIR)")
        run.notes.append(msg)
