"""A sweep's points: expanded in one place and checked in one place.

The basic launcher's up-front check (`launch/cli.py`), the batched launcher (`launch/sweep.py`), the
Slurm submitter (`launch/submit.py`) and `mode=bench`'s sweep all take their points from `expand` and
check each one with `check`, so what one of them refuses, runs or measures is what the others would.
It lives in `execution`, not `launch`, because a mode (bench) uses it and modes sit below `launch`.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException
from omegaconf import OmegaConf

from .. import config as config_mod
from ..config import RunConfig
from ..errors import InputError
from ..protocol import ROLES
from ..protocol.spec import Dataset, Spec
from ..rundir import identity as identity_mod
from ..rundir import layout
from .preflight import preflight
from .ready import Ready

# The modes whose job checks its config, dataset and models before it starts, and the roles each
# checks: a point of another mode is checked by its own entry when it runs.
CHECKED_ROLES: dict[str, tuple[str, ...]] = {"run": ROLES, "bench": ("narrator",)}

# ---- expanding ----------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One point: its task overrides as Hydra's basic sweeper gives the job, and those of them that
    are swept (what tells the point from the others in a message)."""

    overrides: tuple[str, ...]
    swept: tuple[str, ...]


@dataclass(frozen=True)
class Grid:
    """A sweep's keys in Hydra's job order, each with its `key=value` choices (one for a fixed key)."""

    choices: tuple[tuple[str, ...], ...]
    swept: tuple[bool, ...]  # per key: a sweep on the command line, or a config file's sweeper param
    # Sweeps only Hydra's own sweeper can expand (glob() needs its config loader; an interval is no
    # list): left out of the points, with why. A launcher may leave them to Hydra or refuse them.
    unexpanded: tuple[tuple[str, Exception], ...] = ()
    launcher: str = ""  # `hydra.launcher._target_`: which launcher runs the sweep

    def count(self) -> int:
        return math.prod(len(c) for c in self.choices)

    def points(self, most: int | None = None) -> list[Point]:
        """Every point in job order; past `most` points, each value once (the others at their first)."""
        if most is None or self.count() <= most:
            combos = [list(c) for c in itertools.product(*self.choices)]
        else:
            first = [c[0] for c in self.choices]
            combos = [first]
            for i, values in enumerate(self.choices):
                combos += [first[:i] + [v] + first[i + 1 :] for v in values[1:]]
        return [Point(tuple(c), tuple(o for o, s in zip(c, self.swept, strict=True) if s)) for c in combos]


def expand(overrides: Sequence[str], config_name: str = "config") -> Grid:
    """A sweep's points as Hydra's basic sweeper makes them: the config file's `hydra.sweeper.params`
    first, then the command line, one entry per key (a later value replaces an earlier one in place).
    The sweep's own `hydra` overrides are not part of a point. Raises Hydra's own errors."""
    parser = OverridesParser.create()
    given = parser.parse_overrides(list(overrides))
    # The first point composed with Hydra's config, to read the sweeper params a config file declares.
    first = [
        f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else _line(o)
        for o in given
        if _unexpandable(o) is None
    ]
    cfg = config_mod.compose(first, config_name, hydra_config=True)
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    declared = parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
    task = [o for o in given if not o.get_key_element().lstrip("+~").startswith("hydra")]
    entries: OrderedDict[str, tuple[list[str], bool]] = OrderedDict()
    unexpanded: list[tuple[str, Exception]] = []
    for o, from_params in [*((o, True) for o in declared), *((o, False) for o in task)]:
        why = _unexpandable(o)
        if why is not None:
            unexpanded.append((_line(o), why))
            continue
        key = o.get_key_element()
        if o.is_sweep_override():
            entries[key] = ([f"{key}={v}" for v in o.sweep_string_iterator()], True)
        else:
            # Hydra's own rendering of the value, as the job's overrides carry it.
            entries[key] = ([f"{key}={o.get_value_element_as_str()}"], from_params)
    return Grid(
        tuple(tuple(c) for c, _ in entries.values()),
        tuple(s for _, s in entries.values()),
        tuple(unexpanded),
        str(OmegaConf.select(cfg, "hydra.launcher._target_") or ""),
    )


def sweep_of(key: str, values: Sequence[Any]) -> str:
    """The override that sweeps `key` over these values (config data: numbers, strings, lists, ...),
    written in Hydra's grammar; one value is a sweep too (`choice()`, which takes no null)."""
    if len(values) == 1 and values[0] is not None:
        return f"{key}=choice({_written(values[0])})"
    return f"{key}={','.join(_written(v) for v in values)}"


# A string Hydra reads back as the same string without quotes (not a number, bool or null).
_PLAIN = re.compile(r"[A-Za-z_][\w./-]*")
_TYPED_WORDS = {"true", "false", "null", "inf", "nan"}


def _written(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _TYPED_WORDS:
            return value
        # Hydra reads a backslash as one unless it comes before a quote (or the closing quote).
        escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
        return "'" + escaped.replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_written(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_written(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not config data: {value!r}")


def _line(o: Override) -> str:
    """The override as written. Hydra types `input_line` optional (an Override can be built by hand),
    but its parser, the only source of ours, sets it on every override it returns."""
    assert o.input_line is not None, "Hydra's OverridesParser sets input_line on every override"
    return o.input_line


def _unexpandable(o: Override) -> Exception | None:
    if not o.is_sweep_override():
        return None
    if not o.is_discrete_sweep():
        # Hydra's basic sweeper refuses it with this message, whatever launcher runs the sweep.
        return HydraException(f"BasicSweeper does not support sweep type : {o.value_type.name}")  # type: ignore[union-attr]
    if o.value_type == ValueType.GLOB_CHOICE_SWEEP:
        # Hydra's own error would say only "ConfigLoader is not set".
        return ValueError(
            f"{o.input_line}: glob() is expanded only by Hydra's own sweeper (it needs its config loader)"
        )
    return None


# ---- checking -----------------------------------------------------------------------


def from_hydra(exc: BaseException) -> bool:
    """Hydra's own refusal (an unknown key or group option): the command line's, not one point's."""
    return isinstance(exc, HydraException) or type(exc).__module__.startswith("hydra")


def resolved(task: Any) -> dict[str, Any]:
    """A composed config as plain data; an interpolation error is refused as the point's (one line)."""
    try:
        return OmegaConf.to_container(task, resolve=True)  # type: ignore[return-value]
    except Exception as exc:  # interpolation errors name the key themselves
        if from_hydra(exc):
            raise
        raise InputError("config", "", str(exc).splitlines()[0] if str(exc) else "") from None


def load(overrides: Sequence[str], config_name: str = "config") -> dict[str, Any]:
    """One point's config, composed and resolved. Hydra's own errors are raised as they are (a launcher
    refuses the whole sweep for them); anything else is the point's InputError."""
    try:
        task = config_mod.compose(list(overrides), config_name)
    except Exception as exc:
        if from_hydra(exc):
            raise
        raise InputError("config", "", str(exc).splitlines()[0] if str(exc) else "") from None
    return resolved(task)


@dataclass(frozen=True)
class Checked:
    """A point its job would start: its config, and what pre-flight read (None for a mode that
    plays no episodes: its own entry checks it when it runs)."""

    cfg: RunConfig  # its composed source: `cfg.source`
    ready: Ready | None = None

    def where(self) -> tuple[tuple[Spec, ...], identity_mod.Identity, Path]:
        """`mode=run`: this shard's specs, the run's identity and its directory (reads the dataset,
        prompt and model files, so only asked for by a launcher that needs the directory)."""
        assert self.ready is not None
        return where(self.ready)


def check(
    raw: dict[str, Any] | RunConfig,
    *,
    models: bool = True,
    endpoints: bool = True,
    datasets: dict[str, Dataset] | None = None,
    memory_plan: bool = True,
) -> Checked:
    """What the point's own job would refuse at its start, checked without starting anything
    (InputError). `raw`: the point's composed config, or the config already typed at its entry;
    `models`, `endpoints`, `datasets`, `memory_plan`: as `preflight` takes them."""
    cfg = raw if isinstance(raw, RunConfig) else config_mod.validate(raw)
    roles = CHECKED_ROLES.get(cfg.mode)
    if roles is None:
        return Checked(cfg)
    # The same check the point's own job makes first (execution/preflight.py).
    return Checked(
        cfg,
        preflight(cfg, roles=roles, models=models, endpoints=endpoints, datasets=datasets, memory_plan=memory_plan),
    )


def where(ready: Ready) -> tuple[tuple[Spec, ...], identity_mod.Identity, Path]:
    """This shard's specs, the run's identity and its directory."""
    cfg, ds = ready.cfg, ready.dataset
    assert ds is not None
    specs = layout.shard_specs(cfg, ds.specs)
    ident = identity_mod.of_run(cfg, ds.root, ready.pack.templates, ready.endpoints)
    return specs, ident, layout.shard_dir(cfg, layout.run_dir(cfg, ident.key))
