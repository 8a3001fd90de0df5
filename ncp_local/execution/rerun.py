"""`mode=rerun from=DIR`: the config of a finished run, its inputs found again on this machine.

A run's manifest records its resolved config and, in its identity's parts, the content of its
dataset, prompts and weights (rundir/fingerprints.py). The repeat takes each input from where
the run found it if the content there is still the same, else from this command's location, and
refuses, naming the difference, a repeat that would not be the same experiment.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..config import AuditCfg, validate
from ..errors import InputError
from ..protocol import ROLES
from ..protocol.prompts import DEFAULT_DIR, PromptPack
from ..rundir import layout
from ..rundir.fingerprints import dataset_files, model_weights, prompt_files
from ..rundir.identity import FORMAT, differences, file_changes, of_run, summary


class RerunError(InputError):
    def __init__(self, source: str | Path, message: str) -> None:
        super().__init__(source, "from", message)


def _read_manifest(source: Path) -> tuple[Path, dict[str, Any]]:
    """The manifest to repeat: the run's own, or shard 0's for a sharded run."""
    for path in (part / layout.MANIFEST for part in layout.parts(source)):
        if path.is_file():
            return path, layout.read_manifest(path, "from")
    raise RerunError(source, "no manifest.json here (not a run directory)")


def _first(candidates: list[str | None], check: Any) -> tuple[str | None, list[str]]:
    """The first candidate location whose content `check` accepts, and why the others were not."""
    why: list[str] = []
    for c in dict.fromkeys(c for c in candidates if c):
        problems = check(c)
        if not problems:
            return c, []
        why.append(f"{c}: {summary(problems, 3)}")
    return None, why


def _recorded(path: str | None, manifest: Mapping[str, Any]) -> list[str | None]:
    """A recorded location, and for a relative one the same under the directory the run was started in."""
    if not path or Path(path).is_absolute():
        return [path]
    cwd = (manifest.get("command") or {}).get("cwd")
    return [path, str(Path(cwd) / path) if cwd else None]


def rerun_config(now: Mapping[str, Any]) -> dict[str, Any]:
    """`mode=rerun from=DIR`: the config of the run in DIR, found again on this machine.

    The run's resolved config is taken from its manifest as it was, except:
    `mode=run`, a new `out_dir` (this command's, else `<DIR>-rerun`), one
    process (no shards), this command's `concurrency`/`progress`, and the
    locations of dataset, prompts and weights: each is the recorded one if
    its content is still what the run used, else this command's (e.g.
    `dataset.path=...`, `models_root=...`), checked the same way. Anything
    that would make the repeat differ is refused in one line.
    """
    source_arg = now.get("from")
    if not source_arg:
        raise RerunError("config", "give the finished run to repeat: from=DIR")
    source = Path(str(source_arg)).expanduser()
    if not source.is_dir():
        raise RerunError(source, "no such run directory")
    out = now.get("out_dir")
    if out and Path(str(out)).expanduser().resolve() == source.resolve():
        # The run's own directory holds every result already: the "repeat" would play nothing.
        raise InputError(out, "out_dir", "is the run to repeat (from); give another folder, or none (<DIR>-rerun)")
    mpath, manifest = _read_manifest(source)
    recorded = manifest.get("identity_parts")
    if manifest.get("kind") or not isinstance(manifest.get("config"), dict):
        raise RerunError(mpath, f"not a run's manifest (kind {manifest.get('kind')!r}); rerun repeats mode=run")
    if not recorded or recorded.get("format") != FORMAT:
        raise RerunError(mpath, "recorded by an earlier version of the rig: its content hashes cannot be checked")
    raw: dict[str, Any] = copy.deepcopy(manifest["config"])
    # The trials a resume raised the count to (the config is written once; its resumes say the rest).
    raised = [e["trials"] for e in manifest.get("resumes") or [] if isinstance(e, dict) and "trials" in e]
    if raised:
        raw["trials"] = {**(raw.get("trials") or {}), "count": raised[-1]}
    raw.update(
        mode="run",
        concurrency=now.get("concurrency", raw.get("concurrency")),
        progress=now.get("progress", raw.get("progress")),
        shard={"index": 0, "count": 1},
    )
    raw["from"] = str(source.resolve())
    raw["out_dir"] = now.get("out_dir") or f"{source.resolve()}-rerun"

    # Dataset: recorded path, else this command's.
    def dataset_ok(where: str) -> list[str]:
        try:
            return file_changes("", recorded.get("dataset") or {}, dataset_files(where))
        except InputError as exc:
            return [exc.message]

    ds_now = (now.get("dataset") or {}).get("path")
    found, why = _first([*_recorded((raw.get("dataset") or {}).get("path"), manifest), ds_now], dataset_ok)
    if not found:
        raise RerunError(
            mpath,
            "the run's dataset is not found as it was: "
            + "; ".join(why or ["no dataset.path"])
            + " (pass dataset.path=DIR of the same files)",
        )
    raw["dataset"] = {**raw["dataset"], "path": found}

    # Prompts: where the run read them, its prompts.dir, else this command's (or the rig's own).

    asked = AuditCfg.model_validate(raw.get("audit") or {}).templates  # optional stages it asked: in its hashes

    def prompts_ok(where: str) -> list[str]:
        try:
            return file_changes(
                "", recorded.get("prompts") or {}, prompt_files(PromptPack.load(where, required=asked).templates)
            )
        except InputError as exc:
            return [exc.message]

    found, why = _first(
        [
            *_recorded((manifest.get("prompts") or {}).get("path"), manifest),
            *_recorded((raw.get("prompts") or {}).get("dir"), manifest),
            (now.get("prompts") or {}).get("dir"),
            str(DEFAULT_DIR),
        ],
        prompts_ok,
    )
    if not found:
        raise RerunError(
            mpath,
            "the run's prompts are not found as they were: "
            + "; ".join(why)
            + " (pass prompts.dir=DIR of the same templates)",
        )
    raw["prompts"] = {**(raw.get("prompts") or {}), "dir": found}

    # Weights: the recorded path, else the same path under this command's models_root.
    engine = str((raw.get("engine") or {}).get("name"))
    old_root, new_root = str(raw.get("models_root") or ""), str(now.get("models_root") or "")
    for role in ROLES:
        model = raw[role]["model"]
        want = (recorded.get("models") or {}).get(role)
        path = str(model.get("path"))
        moved = new_root + path[len(old_root) :] if old_root and new_root and path.startswith(old_root) else None

        def weights_ok(where: str, name: str = str(model.get("name")), role: str = role, want: Any = want) -> list[str]:
            got = model_weights(SimpleNamespace(name=name, path=where), engine)
            return (
                []
                if got == want
                else differences({**recorded, "models": {role: want}}, {**recorded, "models": {role: got}})
            )

        found, why = _first([path, moved], weights_ok)
        if not found:
            raise RerunError(
                mpath,
                f"{role} model {model.get('name')!r}: the run's weights are not found as they "
                f"were: {'; '.join(why)} (pass models_root=DIR holding the same files)",
            )
        if found != path:
            model["path"] = found
            raw["models_root"] = new_root

    cfg = validate(raw)
    got = of_run(cfg)
    if got.key != manifest.get("identity"):
        raise RerunError(
            mpath,
            f"this machine would not repeat the run: {summary(differences(recorded, got.parts))}"
            f" (the run's git revision: {manifest.get('git_revision', 'unknown')})",
        )
    return raw
