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
  of its weights (rundir/fingerprints.py `weights_fingerprint`); for a role served by an
  endpoint, the served model name and what the server reports of it (its id,
  the model it loaded, its window), never the URL; a role whose engine is not
  the top-level `engine` says its own;
- the rig's version.

`limit` is not in it: episodes are independent, so a run resumed with a
larger `limit` keeps its finished episodes and plays the new ones (a result
is only ever used for the spec, dataset and settings it was sealed with).

`differences` names what sets two identities apart, for a run directory that
refuses another config and for `mode=rerun` (execution/rerun.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bindings import Binding, Bindings, bind
from ..config import LATER_KEYS, NOT_IDENTITY, RunConfig, dataset_path, validate
from ..engines.registry import kind
from ..errors import InputError
from ..protocol import ROLES
from ..protocol.prompts import PromptPack
from ..protocol.spec import text_bytes
from .fingerprints import dataset_files, model_weights, prompt_files, sha256_bytes
from .provenance import rig_version

FORMAT = 1  # bump when the parts change shape: older identities then read as "recorded by an earlier rig"


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


def role_models(cfg: RunConfig, roles: tuple[str, ...]) -> dict[str, Any]:
    """The roles' models as an identity holds them (weights fingerprinted, a served model by its endpoint)."""
    return _models(bind(cfg), roles)


def _load_pack(cfg: RunConfig) -> PromptPack:
    return PromptPack.load(cfg.prompts.get("dir"), required=cfg.optional_templates)


def run_key(raw: Mapping[str, Any]) -> str:
    """The run identity's key for a raw config (reads dataset, prompts and weights)."""
    return of_run(validate(dict(raw))).key


def of_run(
    cfg: RunConfig,
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
            "settings": settings(cfg.source),
            "dataset": dataset_files(root),
            "prompts": prompt_files(templates),
            "models": _models(bind(cfg), ROLES, endpoints),
        }
    )


# What the source run fixed (story, players, limit) is not a re-audit's or a build's setting.
_JUDGE_ONLY = ("narrator", "player", "dataset", "limit", "max_turns", "method", "condition", "trials")


def of_reaudit(
    cfg: RunConfig,
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
            "settings": settings(cfg.source, _JUDGE_ONLY),
            "prompts": prompt_files(templates),
            "models": _models(bind(cfg), ("auditor",), endpoints),
            "source": source,
        }
    )


def of_build(
    cfg: RunConfig,
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
            "settings": settings(cfg.source, _JUDGE_ONLY + ("sources",)),
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


def file_changes(prefix: str, old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
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
    out += file_changes("dataset: ", old.get("dataset") or {}, new.get("dataset") or {})
    out += file_changes("prompts/", old.get("prompts") or {}, new.get("prompts") or {})
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
            out += file_changes(f"{role} weights: ", wa.get("files") or {}, wb.get("files") or {})
    for key in ("source", "sources"):
        if old.get(key) != new.get(key):
            out.append(f"{key} {_short(old.get(key))} -> {_short(new.get(key))}")
    return out or ["identity differs"]


def summary(diffs: list[str], k: int = 6) -> str:
    return ", ".join(diffs[:k]) + (f", ... ({len(diffs)} differences)" if len(diffs) > k else "")
