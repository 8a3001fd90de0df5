"""What ran: each run's engine and the model of each role, read from what its run directory records.

The manifest's `models` section (what the engine pool started: engine kind, model name, weights
path, a served role's endpoint) is the record; a run without one (an older rig, a folder of official
result files) falls back to its recorded config, never to the current one. A scripted run's figures
measure the rig, not a model, and the report says so in one line; settings a scripted engine does not
read (the player's condition, the sampling) are named when runs differ in them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..bindings import recorded_engine
from ..config import SCRIPTED
from ..protocol import ROLES
from .labels import differing
from .runs import Run

NOT_RECORDED = "not recorded"

SCRIPTED_LINE = (
    "Scripted engine: no model ran. These figures measure the rig (protocol, ledger, statistics), "
    "not a model: the answers follow the run's seed and the `engine.*_rate` settings."
)

# Settings a scripted engine's answers never read: the player's condition only changes the player's
# prompt, and the sampling and model settings only reach a model.
_INERT = re.compile(rf"^(condition\..+|({'|'.join(ROLES)})\.(temperature|top_p|max_tokens|model\..+))$")


@dataclass(frozen=True)
class RoleRan:
    role: str
    engine: str  # the engine kind (vllm, openai, scripted); "" when the run does not record it
    model: str  # `scripted`, `<name> (embedded)`, `<name> (<path>)`, `<served name> (served)`, or NOT_RECORDED


@dataclass(frozen=True)
class Ran:
    """One run's engines and models, one entry per role."""

    roles: tuple[RoleRan, ...]

    @property
    def scripted(self) -> bool:
        return bool(self.roles) and all(r.engine == SCRIPTED for r in self.roles)

    @property
    def engine(self) -> str:
        """The run's engine, or each role's when they differ (`narrator=vllm auditor=openai ...`)."""
        kinds = {r.engine for r in self.roles}
        if len(kinds) == 1:
            return kinds.pop() or NOT_RECORDED
        return " ".join(f"{r.role}={r.engine or '?'}" for r in self.roles)

    def model(self, role: str) -> str:
        return next((r.model for r in self.roles if r.role == role), NOT_RECORDED)

    @property
    def models(self) -> str:
        """Every role's model, once when they share it."""
        names = {r.model for r in self.roles}
        if len(names) == 1:
            return names.pop()
        return "; ".join(f"{r.role} {r.model}" for r in self.roles)

    @property
    def line(self) -> str:
        """`engine scripted, no model`, or `engine vllm; model qwen3-8b (/models/...)`."""
        if self.scripted:
            return f"engine {SCRIPTED}, no model (every role)"
        return f"engine {self.engine}; model {self.models}"

    @property
    def short(self) -> str:
        """A table cell: `scripted`, `vllm: qwen3-8b (/models/...)`, or per role when they differ."""
        if self.scripted:
            return SCRIPTED
        kinds = {r.engine for r in self.roles}
        if kinds == {""}:  # a folder of official result files records no engine
            return NOT_RECORDED
        if len(kinds) == 1:
            return f"{self.engine}: {self.models}"
        return "; ".join(f"{r.role} {r.engine or '?'}: {r.model}" for r in self.roles)


def _model(engine: str, rec: Mapping[str, Any], cfg_model: Mapping[str, Any]) -> str:
    if engine == SCRIPTED:
        return SCRIPTED
    name = str(rec.get("name") or cfg_model.get("name") or "")
    if engine == "openai":
        served = (rec.get("endpoint") or {}).get("served_model") or name
        return f"{served} (served)" if served else NOT_RECORDED
    if not name:
        return NOT_RECORDED
    path = str(rec.get("path") or cfg_model.get("path") or "")
    return f"{name} ({path})" if path else name


def what_ran(manifest: Mapping[str, Any]) -> Ran:
    """The run's engine and models as its manifest records them."""
    cfg = manifest.get("config") or {}
    models = manifest.get("models") or {}
    roles = []
    for role in ROLES:
        rec = models.get(role) or {}
        engine = str(rec.get("engine") or recorded_engine(cfg, role))
        roles.append(RoleRan(role, engine, _model(engine, rec, (cfg.get(role) or {}).get("model") or {})))
    return Ran(tuple(roles))


def legend(runs: Sequence[Run], names: Sequence[str] | None = None) -> list[str]:
    """Each run once, by its name (its label unless `names`): its folder, what ran, and its settings in
    full where the name is short."""
    return [
        f"{n}: {r.path}; {what_ran(r.manifest).line}" + (f"; {full}" if (full := r.overrides or r.label) != n else "")
        for n, r in zip(names or [r.label for r in runs], runs, strict=True)
    ]


def ran_lines(runs: Sequence[Run], names: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """What every page of a report or comparison starts with: the legend, then the scripted lines
    (`ran_notes`)."""
    return legend(runs, names), ran_notes([(r.label, r.manifest) for r in runs])[len(runs) :]


def inert_keys(configs: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """Of the keys that differ between scripted runs: (those a scripted engine never reads, the others)."""
    keys = differing(configs)
    return [k for k in keys if _INERT.match(k)], [k for k in keys if not _INERT.match(k)]


def ran_notes(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The lines every page of the report starts with: what ran in each run (label, manifest), the
    scripted line, and which differing settings cannot change a scripted engine's answers."""
    rans = [what_ran(m) for _, m in runs]
    lines = [f"{label}: {r.line}" for (label, _), r in zip(runs, rans, strict=True)]
    if any(r.scripted for r in rans):
        lines.append(
            SCRIPTED_LINE if all(r.scripted for r in rans) else f"Runs on the {SCRIPTED} engine: " + SCRIPTED_LINE
        )
        lines.append(_inert_line([m.get("config") or {} for (_, m), r in zip(runs, rans, strict=True) if r.scripted]))
    return [line for line in lines if line]


def _inert_line(configs: Sequence[Mapping[str, Any]]) -> str:
    if len(configs) < 2:
        return (
            "The player's condition, the temperatures and the models' settings do not change what a "
            "scripted engine answers."
        )
    inert, _ = inert_keys(configs)
    if not inert:
        return ""
    named = ", ".join(f"`{k}`" for k in inert)
    return (
        f"A scripted engine does not read {named}: runs that differ only in it give the same figures "
        "by construction, not as a finding about it."
    )
