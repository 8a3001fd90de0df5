"""Trials: a story played k times, and the name each play (an episode) goes by.

Trial 0 of a story is named by the story's id alone, so a run of one trial
names its results, checkpoints and call-log lines exactly as before trials
existed. Trial t > 0 is `<spec id><SEPARATOR><t>`, e.g. `movie09~t1`: the
separator's `~` is not a spec id character (spec.ID_PATTERN), so an episode
name never reads as another story's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from . import ROLES

SEPARATOR = "~t"
# Which roles draw trial-specific seeds in trials after the first: every role unless told otherwise.
ALL = "all"
_NAME = re.compile(rf"^(?P<spec>.+?){re.escape(SEPARATOR)}(?P<trial>[1-9]\d*)$")


def episode_name(spec_id: str, trial: int) -> str:
    """The episode that is trial `trial` of story `spec_id` (trial 0: the story's own id)."""
    if trial < 0:
        raise ValueError(f"trial {trial} is negative")
    return spec_id if trial == 0 else f"{spec_id}{SEPARATOR}{trial}"


def parse_episode(name: str) -> tuple[str, int]:
    """(spec id, trial) of an episode name; ValueError for a name no episode has: empty, or with the
    separator but no trial after it (`x~t0`, `x~t01`, `x~t`). Any other name is a story's own (trial 0):
    dataset ids are plain (spec.ID_PATTERN), and `mode=bench` names its repeats `<id>~<n>`."""
    m = _NAME.match(name)
    spec_id, trial = (m.group("spec"), int(m.group("trial"))) if m else (name, 0)
    if not spec_id or (trial == 0 and SEPARATOR in name):
        raise ValueError(f"{name!r} is not an episode name (<spec id> or <spec id>{SEPARATOR}<trial>)")
    return spec_id, trial


def story_of(name: str) -> str:
    """The story (spec id) an episode plays."""
    return parse_episode(name)[0]


def varied_roles(vary: str | list[str] | tuple[str, ...]) -> frozenset[str]:
    """The roles `trials.vary` names (`all`: every role); ValueError naming an unknown role."""
    if isinstance(vary, str):
        if vary != ALL:
            raise ValueError(f"{vary!r} is neither {ALL!r} nor a list of roles ({', '.join(ROLES)})")
        return frozenset(ROLES)
    unknown = [r for r in vary if r not in ROLES]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a role (roles: {', '.join(ROLES)}; or {ALL!r})")
    return frozenset(vary)


def seed_episode(episode: str, role: str, vary: frozenset[str]) -> str:
    """The episode whose per-call seeds a call of `role` in `episode` draws: its own when its role
    varies across trials, else trial 0's (so a role not varied sees the seeds it saw in trial 0)."""
    spec_id, trial = parse_episode(episode)
    return episode if trial and role in vary else spec_id


def episode_names(spec_ids: Sequence[str], trials: int) -> list[str]:
    """Every play of these stories, a story's trials side by side (they share their opening prompts,
    so an engine's prefix cache serves them together)."""
    return [episode_name(s, t) for s in spec_ids for t in range(trials)]
