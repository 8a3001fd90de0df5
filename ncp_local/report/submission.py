"""A submission: finished runs packed into one archive that anyone can check, and that check.

The archive (`.tar.gz`) holds `submission.json` (a `Submission`) and, per run, `runs/<key>/manifest.json`
and its sealed `runs/<key>/results/<spec>.json`. `submission.json` lists each result file's sha256,
the run's metrics with their intervals and S(t), every role's model (name, revision, weights
fingerprint, as the manifest records them), the prompt files' hashes, the dataset's digests, and
four flags computed from those records, never asked for:

- `official_prompts`: every template the run's stages and method read hashes to the official file
  (`protocol.prompts.OFFICIAL_SHA256`);
- `official_dataset`: the run's dataset files are the official release's (`fingerprints.OFFICIAL_DATASET_FILES`);
- `complete`: every story of the dataset has a result, and no episode is invalid for an engine-side
  cause (`rundir.invalid.failure_kind`) nor for one cause in most episodes (`systematic_invalid`);
- `verified`: all three.

`validate` rereads everything from the archive alone: the manifest's identity from its parts, each
result's seal against that identity and its spec's hash, each file against the listing, and then
recomputes every metric, interval, S(t) and flag; the first difference is one InputError naming the
member and the field. This is a check of consistency, not a signature: it shows that the numbers
follow from the sealed transcripts and that nothing was edited by hand after sealing, not who ran them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import InputError, shown
from ..protocol.prompts import FALLBACK, OFFICIAL_SHA256, TEMPLATES
from ..protocol.records import EpisodeResult
from ..protocol.reference_format import validation_problem
from ..protocol.stages import method_templates
from ..rundir.fingerprints import OFFICIAL_DATASET_FILES, files_digest
from ..rundir.identity import Identity, digest
from ..rundir.invalid import Outcome, failure_kind, systematic_invalid
from ..rundir.layout import MANIFEST, RESULTS, manifest_problem, parts
from ..rundir.provenance import now, rig_version
from ..rundir.seals import check_bytes
from .reference_runs import REFERENCE_KIND
from .runs import Run, in_dataset_order
from .tables import censored_count, summary_rows

FORMAT = 1
INDEX = "submission.json"
RUNS = "runs"
# An archive bigger than this is not one this rig wrote (100 stories x 100 turns is far below it).
MAX_MEMBER_BYTES = 256 << 20


class Flags(BaseModel):
    model_config = ConfigDict(extra="forbid")
    official_prompts: bool
    official_dataset: bool
    complete: bool
    verified: bool


class RunEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str  # its folder in the archive: runs/<key>/
    label: str
    identity: str
    method: str | None
    condition: str | None
    models: dict[str, Any]  # role -> the manifest's record: name, revision, weights fingerprint
    prompts: dict[str, str]  # template file -> sha256 of its text
    dataset: dict[str, Any]  # the rig's digest, the digest of its files, its stories
    results: dict[str, str]  # spec id -> sha256 of the sealed result file
    metrics: dict[str, Any]  # the aggregate, with intervals (`lo`, `hi`) at `level`
    survival: dict[str, list[float]]  # S(t) and its band, t = 0..max_turns
    flags: Flags
    why_not: list[str]  # one line per flag that is false, saying why


class Submission(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: int
    created: str
    rig_version: str
    resamples: int
    seed: int
    level: float
    flags: Flags  # every run's flag, and-ed
    why_not: list[str]
    runs: list[RunEntry]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _plain(value: Any) -> Any:
    """As JSON gives it back (tuples as lists, keys as strings): what a reader recomputes compares equal."""
    return json.loads(json.dumps(value))


# ---- what is computed from a run's records -----------------------------------------------------


def templates_read(method: str | None) -> tuple[str, ...]:
    """The templates a run of this narrator method reads (the protocol's, then the method's own)."""
    return (*TEMPLATES, *(method_templates(method) if method else ()))


def _prompt_problems(prompts: Mapping[str, str], method: str | None) -> list[str]:
    out = []
    for name in templates_read(method):
        got = prompts.get(f"{name}.txt") or prompts.get(f"{FALLBACK.get(name)}.txt")
        want = OFFICIAL_SHA256.get(name)
        if want is None:
            out.append(f"{name}.txt is the rig's own (the reference publishes no such prompt)")
        elif got != want:
            out.append(f"{name}.txt is not the official file ({'absent' if got is None else 'sha256 ' + got[:12]})")
    return out


def _systematic(results: Mapping[str, EpisodeResult], share: float) -> list[str]:
    out = []
    engine_side = [
        sid
        for sid, r in results.items()
        if r.termination == "invalid" and failure_kind(r.reason.split(": ", 1)[-1]) is not None
    ]
    if engine_side:
        out.append(f"{len(engine_side)} episode(s) invalid for an engine-side cause: {', '.join(engine_side[:5])}")
    broken = systematic_invalid((Outcome.of(r) for r in results.values()), share)
    if broken:
        out.append(broken)
    return out


def run_flags(manifest: Mapping[str, Any], results: Mapping[str, EpisodeResult]) -> tuple[Flags, list[str]]:
    """The four flags of one run, from its manifest's identity parts and its results; and why each false one is."""
    id_parts = manifest.get("identity_parts") or {}
    cfg = manifest.get("config") or {}
    why = []
    bad_prompts = _prompt_problems(id_parts.get("prompts") or {}, (cfg.get("method") or {}).get("name"))
    if bad_prompts:
        more = f" (+{len(bad_prompts) - 3} more)" if len(bad_prompts) > 3 else ""
        why.append("official_prompts: " + "; ".join(bad_prompts[:3]) + more)
    files = id_parts.get("dataset") or {}
    official_dataset = files_digest(files) == OFFICIAL_DATASET_FILES
    if not official_dataset:
        why.append(f"official_dataset: its files (digest {files_digest(files)[:12]}) are not the official release's")
    stories = list(Identity(dict(id_parts)).spec_hashes())
    missing = [s for s in stories if s not in results]
    incomplete = []
    if missing:
        more = ", ..." if len(missing) > 5 else ""
        incomplete.append(f"{len(missing)} of {len(stories)} stories have no result ({', '.join(missing[:5])}{more})")
    incomplete += _systematic(results, float(cfg.get("max_invalid_share", 0.5)))
    if incomplete:
        why.append("complete: " + "; ".join(incomplete))
    flags = Flags(
        official_prompts=not bad_prompts,
        official_dataset=official_dataset,
        complete=bool(stories) and not incomplete,
        verified=not bad_prompts and official_dataset and bool(stories) and not incomplete,
    )
    return flags, why


def run_figures(run: Run, resamples: int, seed: int, level: float) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """The run's metrics with their intervals, and S(t) with its band (the report's own computation)."""
    [row] = summary_rows([run], resamples, seed, level)
    a = row.agg
    metrics: dict[str, Any] = {
        "episodes": a.episodes,
        "scored": a.scored,
        "censored": censored_count(a),
        "max_turns": run.max_turns,
        "terminations": a.terminations,
        "bound_hits": a.bound_hits,
    }
    for name, iv in row.ci.items():
        metrics[name] = {"point": iv.point, "lo": iv.lo, "hi": iv.hi}
    survival = {"s": list(a.survival), "lo": list(a.survival_lo), "hi": list(a.survival_hi)}
    return _plain(metrics), _plain(survival)


def _and(flags: list[Flags]) -> Flags:
    return Flags(**{k: bool(flags) and all(getattr(f, k) for f in flags) for k in Flags.model_fields})


# ---- writing ----------------------------------------------------------------------------------


def _result_bytes(run: Run) -> dict[str, bytes]:
    """Each counted result's file as it lies on disk (the first shard holding it, as `load_run` keeps)."""
    out: dict[str, bytes] = {}
    for part in parts(run.path):
        for sid in run.results:
            f = part / RESULTS / f"{sid}.json"
            if sid not in out and f.is_file():
                out[sid] = f.read_bytes()
    return out


def build(runs: list[Run], resamples: int, seed: int, level: float) -> bytes:
    """The archive of these runs (a deterministic `.tar.gz`); an InputError for a run that cannot be verified."""
    members: dict[str, bytes] = {}
    entries = []
    keys: set[str] = set()
    for run in runs:
        if run.manifest.get("kind") == REFERENCE_KIND:
            raise InputError(run.path, "runs", "official result files carry no seals: a submission takes rig runs")
        if not run.manifest.get("identity_parts"):
            raise InputError(run.path / MANIFEST, "identity_parts", "none recorded (an older rig): nothing to verify")
        if not run.results:
            raise InputError(run.path, "runs", "no result passes its check: nothing to submit")
        key = run.key
        n = 2
        while key in keys:
            key, n = f"{run.key}-{n}", n + 1
        keys.add(key)
        files = _result_bytes(run)
        manifest_path = next(p / MANIFEST for p in parts(run.path) if (p / MANIFEST).is_file())
        members[f"{RUNS}/{key}/{MANIFEST}"] = manifest_path.read_bytes()
        for sid, data in files.items():
            members[f"{RUNS}/{key}/{RESULTS}/{sid}.json"] = data
        entries.append(_entry(key, run, {sid: _sha(d) for sid, d in files.items()}, resamples, seed, level))
    flags = _and([e.flags for e in entries])
    why = [f"{e.key}: {line}" for e in entries for line in e.why_not]
    sub = Submission(
        format=FORMAT,
        created=now(),
        rig_version=rig_version(),
        resamples=resamples,
        seed=seed,
        level=level,
        flags=flags,
        why_not=why,
        runs=entries,
    )
    members[INDEX] = (sub.model_dump_json(indent=1) + "\n").encode()
    return _tar(members)


def _entry(key: str, run: Run, listing: dict[str, str], resamples: int, seed: int, level: float) -> RunEntry:
    m = run.manifest
    id_parts = m.get("identity_parts") or {}
    cfg = m.get("config") or {}
    metrics, survival = run_figures(run, resamples, seed, level)
    flags, why = run_flags(m, run.results)
    return RunEntry(
        key=key,
        label=run.label,
        identity=str(m.get("identity")),
        method=(cfg.get("method") or {}).get("name"),
        condition=(cfg.get("condition") or {}).get("name"),
        models=m.get("models") or {},
        prompts=dict(id_parts.get("prompts") or {}),
        dataset=_dataset(m),
        results=listing,
        metrics=metrics,
        survival=survival,
        flags=flags,
        why_not=why,
    )


def _dataset(manifest: Mapping[str, Any]) -> dict[str, Any]:
    files = (manifest.get("identity_parts") or {}).get("dataset") or {}
    return {
        "sha256": (manifest.get("dataset") or {}).get("sha256"),
        "files_sha256": files_digest(files),
        "stories": len(Identity({"dataset": files}).spec_hashes()),
    }


def _tar(members: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    # mtime 0 and sorted names (tarfile's own `w:gz` would stamp the time): the same runs, the same bytes.
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(members[name]))
    return buf.getvalue()


# ---- reading and validating ---------------------------------------------------------------------


def read_archive(path: Path) -> dict[str, bytes]:
    """The archive's files by name, read in memory (nothing is extracted); a damaged archive is one InputError."""
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                if info.size > MAX_MEMBER_BYTES:
                    raise InputError(f"{path}:{info.name}", "submission", "too large for a submission file")
                f = tar.extractfile(info)
                if f is None:
                    continue
                members[info.name] = f.read()
    except FileNotFoundError:
        raise InputError(path, "submission", "no such file") from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise InputError(
            path, "submission", f"not a readable submission archive (truncated or damaged: {exc})"
        ) from None
    if INDEX not in members:
        raise InputError(path, "submission", f"no {INDEX} in the archive: not a submission")
    return members


def _load_json(path: Path, name: str, data: bytes) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"{path}:{name}", "", "not JSON (truncated or damaged)") from None


def _first_difference(recorded: Any, computed: Any, where: str) -> str | None:
    """The first path at which two JSON values differ, `where.key.key`, with both values."""
    if isinstance(recorded, dict) and isinstance(computed, dict):
        for k in sorted(set(recorded) | set(computed), key=str):
            if k not in recorded or k not in computed:
                return f"{where}.{k}: {'absent' if k not in recorded else 'present'} recorded"
            d = _first_difference(recorded[k], computed[k], f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(recorded, list) and isinstance(computed, list) and len(recorded) == len(computed):
        for i, (r, c) in enumerate(zip(recorded, computed, strict=True)):
            d = _first_difference(r, c, f"{where}.{i}")
            if d:
                return d
        return None
    if json.dumps(recorded) != json.dumps(computed):
        return f"{where}: {shown(recorded)} recorded, {shown(computed)} recomputed"
    return None


def _check_run(path: Path, members: Mapping[str, bytes], i: int, entry: RunEntry, sub: Submission) -> Flags:
    base = f"{RUNS}/{entry.key}"
    where = f"{path}:{base}/{MANIFEST}"
    if f"{base}/{MANIFEST}" not in members:
        raise InputError(f"{path}:{base}/{MANIFEST}", "", "missing (the run's manifest)")
    manifest = _load_json(path, f"{base}/{MANIFEST}", members[f"{base}/{MANIFEST}"])
    problem = manifest_problem(manifest)
    if problem:
        raise InputError(where, "", f"not a run manifest: {problem}")
    id_parts = manifest.get("identity_parts") or {}
    recorded_files = (manifest.get("prompts") or {}).get("files") or {}
    for name in sorted(set(recorded_files) | set(id_parts.get("prompts") or {})):
        if recorded_files.get(name) != (id_parts.get("prompts") or {}).get(name):
            raise InputError(where, f"prompts.files.{name}", "differs from identity_parts.prompts (edited)")
    if digest(id_parts) != manifest.get("identity"):
        raise InputError(where, "identity_parts", f"do not hash to its identity {manifest.get('identity')} (edited)")
    claims = f"{path}:{INDEX}"
    for field, recorded, actual in (
        ("identity", entry.identity, manifest.get("identity")),
        ("prompts", entry.prompts, id_parts.get("prompts") or {}),
        ("models", entry.models, manifest.get("models") or {}),
        ("dataset", entry.dataset, _dataset(manifest)),
    ):
        d = _first_difference(_plain(recorded), _plain(actual), f"runs.{i}.{field}")
        if d:
            raise InputError(claims, "", f"{d} from the run's manifest")
    found = {n[len(base) + len(RESULTS) + 2 : -len(".json")] for n in members if n.startswith(f"{base}/{RESULTS}/")}
    for sid in sorted(set(entry.results) - found):
        raise InputError(f"{path}:{base}/{RESULTS}/{sid}.json", "", f"missing (listed in {INDEX}): story {sid}")
    for sid in sorted(found - set(entry.results)):
        raise InputError(f"{path}:{base}/{RESULTS}/{sid}.json", "", f"not listed in {INDEX} (added)")
    spec_hashes = Identity(dict(id_parts)).spec_hashes()
    results: dict[str, EpisodeResult] = {}
    for sid in entry.results:
        name = f"{base}/{RESULTS}/{sid}.json"
        data = members[name]
        if _sha(data) != entry.results[sid]:
            raise InputError(f"{path}:{name}", "", f"its sha256 is not the one {INDEX} lists (edited or swapped)")
        record, problem = check_bytes(data, sid, EpisodeResult, manifest.get("identity"), spec_hashes or None)
        if record is None:
            raise InputError(f"{path}:{name}", "", problem)
        results[sid] = record
    run = Run(path=Path(base), label=entry.label, manifest=manifest, results=in_dataset_order(results, manifest))
    flags, why = run_flags(manifest, run.results)
    metrics, survival = run_figures(run, sub.resamples, sub.seed, sub.level)
    recomputed: tuple[tuple[str, Any, Any], ...] = (
        ("flags", entry.flags, flags),
        ("why_not", entry.why_not, why),
        ("metrics", entry.metrics, metrics),
        ("survival", entry.survival, survival),
    )
    for field, recorded, actual in recomputed:
        d = _first_difference(_plain(_dump(recorded)), _plain(_dump(actual)), f"runs.{i}.{field}")
        if d:
            raise InputError(claims, "", f"{d} from the sealed results")
    return flags


def _dump(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


def validate(path: str | Path) -> Submission:
    """The archive's submission when every seal, hash, metric and flag in it checks; else the first problem."""
    path = Path(path).expanduser()
    members = read_archive(path)
    try:
        sub = Submission.model_validate(_load_json(path, INDEX, members[INDEX]))
    except ValidationError as exc:
        raise InputError(f"{path}:{INDEX}", "", validation_problem(exc)) from None
    if sub.format != FORMAT:
        raise InputError(f"{path}:{INDEX}", "format", f"{sub.format}, this rig reads {FORMAT}")
    listed = {e.key for e in sub.runs}
    stray = sorted({n.split("/")[1] for n in members if n.startswith(f"{RUNS}/") and n.count("/") >= 2} - listed)
    if stray:
        raise InputError(f"{path}:{RUNS}/{stray[0]}", "", f"a run not listed in {INDEX} (added)")
    flags = [_check_run(path, members, i, e, sub) for i, e in enumerate(sub.runs)]
    overall = _and(flags)
    why = [f"{e.key}: {line}" for e in sub.runs for line in e.why_not]
    for field, recorded, actual in (("flags", sub.flags, overall), ("why_not", sub.why_not, why)):
        d = _first_difference(_plain(_dump(recorded)), _plain(_dump(actual)), field)
        if d:
            raise InputError(f"{path}:{INDEX}", "", f"{d} from the runs")
    return sub
