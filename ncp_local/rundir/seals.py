"""The seal every result and checkpoint carries, and the check a file must pass before it is used.

A seal holds the record's spec id (and trial, past trial 0), the sha256 of the spec file it was
played on, the run identity and a hash of the record itself. A file that fails the check
(truncated, not JSON, another spec's, another run's, a spec the dataset lacks, edited) is never
used: the run directory (rundir/store.py) moves it to `quarantine/` and plays the episode again;
reports and merges apply the same check (`check_file`, `check_result`) without moving anything.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError, from_json, to_json

from ..protocol.plant import PlantResult
from ..protocol.reaudit import ReauditResult
from ..protocol.records import Checkpoint, EpisodeResult
from ..protocol.trials import episode_name, parse_episode
from .formats import FORMAT_KEY, Kind, check_version, stamped
from .identity import Identity

SEAL = "seal"


def _body_hash(record: BaseModel) -> str:
    return hashlib.sha256(record.model_dump_json().encode("utf-8")).hexdigest()


# The records a run directory seals, each of one spec, and their kinds of file (rundir/formats.py).
Sealed = EpisodeResult | ReauditResult | PlantResult | Checkpoint
_KIND: dict[type[BaseModel], Kind] = {
    EpisodeResult: "result",
    Checkpoint: "checkpoint",
    ReauditResult: "reaudit",
    PlantResult: "plant",
}


def _kind(record: BaseModel) -> Kind:
    return _KIND.get(type(record), "result")


def sealed_json(record: Sealed, spec_sha256: str, run: str, body: bytes | None = None) -> bytes:
    """The record's JSON with its seal first (spec id, spec hash, run identity, record hash).

    `body`: an `EpisodeResult`'s `model_dump_json()`, made without the record's objects (the record given
    is its head: `Ending.result_json`); the file's data is then read from it, the same data as
    `model_dump(mode="json")`'s, as a result holds no float (JSON's null for inf and nan: the one
    difference; tests/test_turn_log.py checks the schema). Its file's bytes (UTF-8)."""
    trial = getattr(record, "trial", 0)
    seal = {
        "spec_id": record.spec_id,
        **({"trial": trial} if trial else {}),  # trial 0's seal is the seal a run without trials writes
        "spec_sha256": spec_sha256,
        "run": run,
        "sha256": _body_hash(record) if body is None else hashlib.sha256(body).hexdigest(),
    }
    data = record.model_dump(mode="json") if body is None else from_json(body)
    # A spliced result holds no float (the same test): nothing json.dumps would write otherwise to look for.
    return pretty_json({SEAL: seal, **stamped(data, _kind(record))}, floats=body is None)


# The forms in which pydantic_core writes a float that json.dumps writes otherwise: 1.5e-05 as
# 0.000015, 1.5e-07 as 1.5e-7 (tests/test_seals.py checks over random floats that no other differs).
_NOT_AS_PYTHON = (re.compile(rb"0\.0000"), re.compile(rb"e-[0-9][,\n]"))


def pretty_json(data: dict[str, Any], floats: bool = True) -> bytes:
    """`json.dumps(data, indent=1, ensure_ascii=False)` in UTF-8, byte for byte, at compiled speed.

    json.dumps is pure Python once it indents: 10-20 ms for a 100-turn result, on the writer thread
    and holding the interpreter. pydantic_core writes the same bytes (key order, escapes, NaN and
    Infinity, non-ASCII as it is) in a tenth of that, but for floats below 1e-4, which it writes
    otherwise: where its output holds such a form, even within a string, json.dumps writes it.
    `floats=False`: `data` holds none, so the output is not searched for them (half a millisecond for
    a 100-turn result). Results are compared byte for byte across rig versions (rundir/formats.py)."""
    try:
        out = to_json(data, indent=1, inf_nan_mode="constants")
    except PydanticSerializationError:  # a lone surrogate: json.dumps takes it, and its encoding fails as before
        out = None
    if out is None or (floats and any(form.search(out) for form in _NOT_AS_PYTHON)):
        return json.dumps(data, indent=1, ensure_ascii=False).encode("utf-8")
    return out


def check_file(
    path: Path,
    model: type[BaseModel],
    run: str | None,
    spec_hashes: Mapping[str, str] | None = None,
    require_seal: bool = True,
) -> tuple[Any, str]:
    """(record, "") for a file that passes, (None, reason) for one that must not be used.

    `run`: the identity it must carry (None: not checked); `spec_hashes`:
    spec id -> file hash for every spec of the run's dataset (None: not
    checked); `require_seal=False` accepts an unsealed file of an older rig.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, f"cannot read ({exc.strerror})"
    return check_bytes(raw, path.stem, model, run, spec_hashes, require_seal, where=path)


def check_bytes(
    raw: bytes,
    name: str,
    model: type[BaseModel],
    run: str | None,
    spec_hashes: Mapping[str, str] | None = None,
    require_seal: bool = True,
    where: str | Path | None = None,
) -> tuple[Any, str]:
    """`check_file` on a file's bytes (`name`: its file name's stem, the episode it must hold), e.g. one
    read from an archive (`where` names it). A file in a newer format raises `NewerFormat`: it is
    refused, never taken for damage."""
    try:
        expected, trial = parse_episode(name)
    except ValueError:
        return None, "not an episode's file (a stray file)"
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, "not JSON (truncated or damaged)"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    seal = data.pop(SEAL, None)
    check_version(where or name, data, _KIND.get(model, "result"))
    data.pop(FORMAT_KEY, None)
    if spec_hashes is not None and expected not in spec_hashes:
        return None, f"no spec {expected!r} in the run's dataset (a stray file)"
    if seal is None and require_seal:
        return None, "no seal (not written by this run)"
    if seal is not None and not isinstance(seal, dict):
        return None, "damaged seal"
    if seal:
        if seal.get("spec_id") != expected or seal.get("trial", 0) != trial:
            return None, _moved(str(seal.get("spec_id")), int(seal.get("trial") or 0), name)
        if run is not None and seal.get("run") != run:
            return None, f"from another run (identity {seal.get('run')}, this run is {run})"
        if spec_hashes is not None and seal.get("spec_sha256") and seal["spec_sha256"] != spec_hashes[expected]:
            return None, f"played on another version of spec {expected!r}"
    try:
        record = model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        return None, f"not a valid {model.__name__}: {where}: {err['msg']}"
    held = (getattr(record, "spec_id", expected), getattr(record, "trial", 0))
    if held != (expected, trial):
        return None, _moved(*held, name)
    if seal and seal.get("sha256") != _body_hash(record):
        return None, "its content does not match its seal (edited or damaged)"
    return record, ""


def _moved(spec_id: str, trial: int, stem: str) -> str:
    held = f"spec {spec_id!r}" if not trial else f"episode {episode_name(spec_id, trial)!r}"
    return f"holds {held}, not {stem!r} (a file moved or copied)"


def check_result(path: Path, manifest: Mapping[str, Any], model: type[BaseModel] = EpisodeResult) -> tuple[Any, str]:
    """A reader's check of one result file against its run's manifest: (record, "") or (None, reason).

    Runs recorded by this rig (manifest with identity parts) must seal every
    result with their identity and their dataset's spec hashes; older runs
    and hand-made folders are checked for what they carry (JSON, spec id).
    """
    parts = manifest.get("identity_parts")
    if parts:
        return check_file(path, model, manifest.get("identity"), Identity(parts).spec_hashes() or None)
    return check_file(path, model, manifest.get("identity"), None, require_seal=False)
