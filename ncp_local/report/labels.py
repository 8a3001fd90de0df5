"""Row labels for compared runs: what differs between their configs.

Runs of a temperature or seed sweep share models, condition and method, so
a label built from those is the same on every row. Here each run is named
by the settings that tell it apart (`narrator.temperature=0.2 seed=1`), from
the configs recorded in the manifests. Bookkeeping keys (paths, concurrency,
report options: `config.NOT_IDENTITY`) never label a row. A role whose
model differs is named by the model (`auditor=qwen3-8b`) rather than by the
dozen settings that differ with it. A template (`report.label`) names
rows explicitly: `{narrator.temperature}/{seed}`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..config import LATER_KEYS
from ..protocol import ROLES
from ..rundir.identity import settings

MAX_KEYS = 5  # differing keys shown in a label; the rest are counted
MAX_VALUE = 40  # characters of one value
_FIELD = re.compile(r"\{([A-Za-z0-9_.\-]+)\}")


def flat(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(d, Mapping) and d:
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], d


def _shown(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), default=str)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 3] + "..."


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    return dict(flat(settings(config)))


def differing(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Dotted keys whose values are not the same in every config, in config order."""
    flats = [_settings(c) for c in configs]
    keys: dict[str, None] = {}
    for f in flats:
        keys.update(dict.fromkeys(f))
    missing = object()
    return [k for k in keys if len({json.dumps(f.get(k, missing), sort_keys=True, default=str) for f in flats}) > 1]


def _collapsed(keys: list[str], flats: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """(label key, how to read it) with a role's model settings folded into `role=<model name>`."""
    by_model = [r for r in ROLES if f"{r}.model.name" in keys]
    out: list[tuple[str, Any]] = []
    for k in keys:
        role = k.split(".", 1)[0]
        if role in by_model:
            if k == f"{role}.model.name":
                out.append((role, k))
            # The rest follows from the role's file (max_tokens, bounds, ...); when it does not tell two
            # runs apart by itself, `by_difference` shows every key.
            continue
        else:
            out.append((k, k))
    return out


def _label(f: Mapping[str, Any], parts: list[tuple[str, Any]]) -> str:
    # A later key the identity leaves out at its old behaviour (config.LATER_KEYS) shows that value.
    shown = [
        f"{name}={_shown(f.get(key, LATER_KEYS[key][0] if key in LATER_KEYS else None))}"
        for name, key in parts[:MAX_KEYS]
    ]
    if len(parts) > MAX_KEYS:
        shown.append(f"+{len(parts) - MAX_KEYS} more")
    return " ".join(shown)


def by_difference(configs: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """One label per config naming what differs; None when nothing does (or a single run)."""
    if len(configs) < 2:
        return None
    keys = differing(configs)
    if not keys:
        return None
    flats = [_settings(c) for c in configs]
    labels = [_label(f, _collapsed(keys, flats)) for f in flats]
    if len(set(labels)) < len(labels):  # folding hid what tells two runs apart: show every key
        labels = [_label(f, [(k, k) for k in keys]) for f in flats]
    return labels


class Recorded(Protocol):
    """A run as a short name needs it: its folder and its manifest."""

    @property
    def path(self) -> Path: ...
    @property
    def manifest(self) -> dict[str, Any]: ...


SHORT_KEYS = 3  # settings named in a short name; the legend holds them all


def short_names(runs: Sequence[Recorded]) -> list[str]:
    """Each run named by what sets it apart from the first (the baseline, named so): the settings that
    differ from the baseline's, by their last part (`seed=1`, `condition=natural`), trials where their count
    differs; the folder's name where nothing recorded differs, or beside the name where two runs are alike.
    The full labels (`by_difference`) go once into a legend."""
    configs = [dict(r.manifest.get("config") or {}) for r in runs]
    trials = [int((c.get("trials") or {}).get("count") or 1) for c in configs]
    names = ["baseline"]
    for run, cfg, k in zip(runs[1:], configs[1:], trials[1:], strict=True):
        keys = differing([configs[0], cfg]) if cfg and configs[0] else []  # no config recorded: its folder
        flat_cfg = dict(flat(cfg))
        parts = [f"{_short_key(key)}={_value(flat_cfg.get(key))}" for key in keys[:SHORT_KEYS]]
        parts += [f"+{len(keys) - SHORT_KEYS}"] if len(keys) > SHORT_KEYS else []
        parts += [f"trials={k}"] if k != trials[0] else []
        names.append(" ".join(parts) or run.path.name)  # nothing recorded differs: its folder
    if len(set(names)) < len(names):
        names = [f"{n} [{r.path.name}]" for n, r in zip(names, runs, strict=True)]
    return names


def _value(v: object) -> str:
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _short_key(key: str) -> str:
    """`seed`, `condition.name` -> `condition`, `narrator.model.name` -> `narrator`, a role's setting by its
    role and last part (`narrator.temperature`), else the last part."""
    if key.endswith(".model.name"):
        return key.split(".")[0]
    head, _, last = key.rpartition(".")
    if head.split(".")[0] in ROLES:
        return f"{head.split('.')[0]}.{last}"
    return head.split(".")[-1] if last == "name" and head else last


def from_template(template: str, config: Mapping[str, Any]) -> str:
    """`{narrator.temperature}/{seed}` filled from the run's config (`?` for a key it lacks)."""
    f = dict(flat(config))

    def value(m: re.Match[str]) -> str:
        key = m.group(1)
        if key in f:
            return _shown(f[key])
        below = {k: v for k, v in f.items() if k.startswith(key + ".")}
        return _shown(below) if below else "?"

    return _FIELD.sub(value, template)


SHORT = 64  # characters of a label shown where space is short (a table's first column, a plot's panel title)
_ROLE_PREFIX = re.compile(rf"\b({'|'.join(ROLES)})\.")


def shortened(label: str, limit: int = SHORT) -> str:
    """A label that fits `limit` characters, for a narrow place that shows the full one on hover: role
    prefixes go to their initial (`narrator.temperature=0.2` -> `n.temperature=0.2`), then the tail
    gives way to an ellipsis. A label that fits is returned as it is."""
    if len(label) <= limit:
        return label
    short = _ROLE_PREFIX.sub(lambda m: m.group(1)[0] + ".", label)
    return short if len(short) <= limit else short[: limit - 1].rstrip() + "\u2026"
