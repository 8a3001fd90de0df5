"""A folder of result files written by the official NCP-Bench code, read as a run for reports.

The official runner writes `<spec id>.json` per finished episode into its output folder and
`<spec id>.checkpoint.json` while one is under way (its `configuration` names the models, the
method, the condition and `max_turns`; the runner deletes it once the episode ends). Nothing else
records the models, so a folder without a checkpoint reads under its own name, and its
`max_turns` is inferred from the episodes (a `max_turns` ending tells it; otherwise the longest
episode, said in a note).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import InputError
from ..protocol.records import EpisodeResult
from ..protocol.reference_format import (
    MISSING_FROM_REFERENCE,
    NOT_EXPORTED,
    OfficialResult,
    from_reference,
    to_reference,
    validation_problem,
)
from ..protocol.spec import Spec
from ..rundir.atomic import atomic_write

CHECKPOINT_SUFFIX = ".checkpoint.json"
REFERENCE_KIND = "reference"  # the manifest kind given to such a folder when read as a run


class _Configuration(BaseModel):
    """The official runner's checkpoint `configuration` (the keys a report uses)."""

    model_config = ConfigDict(extra="ignore")
    method: str | None = None
    condition: str | None = None
    narrator_model: str | None = None
    player_model: str | None = None
    auditor_model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_turns: int | None = None


@dataclass
class ReferenceFolder:
    results: dict[str, EpisodeResult]
    manifest: dict[str, Any]
    unfinished: tuple[str, ...]
    notes: list[str] = field(default_factory=list)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise InputError(path, "runs", f"cannot read ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(path, "runs", "not JSON (truncated or damaged)") from None


def result_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*.json") if not p.name.endswith(CHECKPOINT_SUFFIX))


def looks_like_reference(root: Path) -> bool:
    """A folder of JSON files and no run-directory parts: the official runner's output (or another
    format, which `read_reference_folder` then names)."""
    return root.is_dir() and not (root / "manifest.json").exists() and bool(result_files(root))


def _configuration(root: Path) -> _Configuration | None:
    for path in sorted(root.glob(f"*{CHECKPOINT_SUFFIX}")):
        data = _json(path)
        conf = data.get("configuration") if isinstance(data, dict) else None
        if isinstance(conf, dict):
            try:
                return _Configuration.model_validate(conf)
            except ValidationError as exc:
                raise InputError(path, "configuration", validation_problem(exc)) from None
    return None


def _manifest(conf: _Configuration | None, max_turns: int) -> dict[str, Any]:
    """A manifest of the parts a report reads, from what the folder records (labels, max_turns)."""
    config: dict[str, Any] = {"max_turns": max_turns}
    if conf is not None:
        for role in ("narrator", "player", "auditor"):
            name = getattr(conf, f"{role}_model")
            if name:
                config[role] = {"model": {"name": name}, "temperature": conf.temperature, "top_p": conf.top_p}
        if conf.condition:
            config["condition"] = {"name": conf.condition}
        if conf.method:
            config["method"] = {"name": conf.method}
    return {"kind": REFERENCE_KIND, "config": config}


def read_reference_folder(root: Path) -> ReferenceFolder:
    """Every official result file of `root` as a rig record; a file of another format is one
    InputError naming the file and its first wrong field."""
    parsed: list[OfficialResult] = []
    for path in result_files(root):
        try:
            data = OfficialResult.model_validate(_json(path))
        except ValidationError as exc:
            raise InputError(path, "runs", f"not an official result file: {validation_problem(exc)}") from None
        if data.episode.id != path.stem:
            raise InputError(path, "runs", f"holds episode {data.episode.id!r}, not {path.stem!r}")
        parsed.append(data)
    conf = _configuration(root)
    notes = [MISSING_FROM_REFERENCE]
    if conf is not None and conf.max_turns:
        max_turns = conf.max_turns
    else:
        limits = {len(d.turns) for d in parsed if d.termination == "max_turns"}
        max_turns = max(limits or {max((len(d.turns) for d in parsed), default=0)})
        if not limits:
            notes.append(f"max_turns not recorded: taken as {max_turns}, the longest episode")
    results: dict[str, EpisodeResult] = {}
    for path, data in zip(result_files(root), parsed, strict=True):
        try:
            results[data.episode.id] = from_reference(data, max_turns)
        except ValueError as exc:
            raise InputError(path, "runs", f"not an official result file: {exc}") from None
    checkpoints = {p.name[: -len(CHECKPOINT_SUFFIX)] for p in root.glob(f"*{CHECKPOINT_SUFFIX}")}
    unfinished = sorted(checkpoints - set(results))
    if unfinished:
        notes.append(f"{len(unfinished)} episode(s) unfinished (checkpoint, no result): left out")
    return ReferenceFolder(results, _manifest(conf, max_turns), tuple(unfinished), notes)


def write_reference_folder(results: Mapping[str, EpisodeResult], specs: Mapping[str, Spec], out: Path) -> list[str]:
    """Each result as the official runner writes it, `out/<spec id>.json`; the lines a reader must
    know (episodes left out) are returned. Every file is built before the first is written."""
    files: dict[str, str] = {}
    left_out = []
    for sid, result in results.items():
        if result.termination in NOT_EXPORTED:
            left_out.append(sid)
            continue
        files[sid] = json.dumps(to_reference(result, specs[result.spec_id]), ensure_ascii=False, indent=2) + "\n"
    for sid, text in files.items():
        atomic_write(out / f"{sid}.json", text)
    notes = []
    if left_out:
        notes.append(
            f"{len(left_out)} invalid episode(s) not exported (the official format has no such ending): "
            + ", ".join(left_out[:5])
            + (", ..." if len(left_out) > 5 else "")
        )
    return notes
