"""What a run's failures say as a whole, read from its records: the cause of a failed call that is the
engine's or the window's (`failure_kind`), and a run whose finished episodes measured nothing for one
cause (`systematic_invalid`). The run's own exit (execution) and the submission check (report) both ask."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ..protocol.records import EpisodeResult


@dataclass(frozen=True)
class Outcome:
    """What the verdict on a run reads of an episode: how it ended, why, and how many turns committed.
    The run keeps it for each episode it ends, so that its verdict need not read back the results it has
    just written (800 of them at turn 100: seconds with the interpreter held, the loop stalled with it)."""

    termination: str
    reason: str
    turns: int

    @classmethod
    def of(cls, result: EpisodeResult) -> Outcome:
        return cls(result.termination, result.reason, len(result.turns))


def generic(text: str) -> str:
    """A failure's text with its numbers (turns, token counts, positions) made alike, for grouping."""
    return re.sub(r"-?\d+", "N", text)[:200]


def failure_kind(error: str) -> str | None:
    """The cause of a failed call when it is the engine's or the window's, not the model's answer."""
    if error.startswith("engine error:"):
        return generic(error)
    if error.startswith("context_overflow"):
        return "context_overflow: the prompt leaves less room than the stage needs (see mode=plan)"
    return None


def systematic_invalid(results: Iterable[Outcome], share: float) -> str | None:
    """One line when more than `share` of the finished episodes measured nothing for one cause: `invalid`
    for the same reason, or `context_limit` before their first committed turn (each is censored
    honestly, but a run of them measured nothing: the answers fill the window)."""
    total, causes, stages = 0, Counter[tuple[str, str]](), Counter[str]()
    for r in results:  # one pass, each result let go after it (they may be read from disk one at a time)
        total += 1
        if r.termination == "invalid":
            causes["invalid", generic(r.reason)] += 1
        elif r.termination == "context_limit" and r.turns == 0:
            causes["context_limit", ""] += 1
            stages[generic(r.reason)] += 1
    if not total or not causes:
        return None
    (cause, reason), n = causes.most_common(1)[0]
    if n / total <= share:
        return None
    if cause == "invalid":
        return f"{n} of {total} episodes are invalid for the same reason: {reason}"
    return (
        f"{n} of {total} episodes ended context_limit before their first committed turn "
        f"(e.g. {stages.most_common(1)[0][0]}): the answers fill the model's window, so the next call has no "
        "room; set the roles' output bounds (<role>.bounds, e.g. text_chars) or use a model with a larger "
        "window"
    )
