"""The failures that end one episode (and only it): a call that stayed invalid, a call that no longer fits.

Apart from `episode.py` (which re-exports them) so that a narrator method's adapter can raise them too.
"""

from __future__ import annotations

from typing import Literal

from .turns import at as said_at

__all__ = ["CallFailed", "ContextLimit"]


class CallFailed(Exception):
    """A call stayed invalid after every attempt; ends this episode only."""

    termination: Literal["invalid", "context_limit"] = "invalid"

    def __init__(self, stage: str, turn: int, reason: str) -> None:
        super().__init__(f"{stage} {said_at(turn)}: {reason}")
        self.stage, self.turn, self.reason = stage, turn, reason


class ContextLimit(CallFailed):
    """A call's prompt leaves less room than its stage needs: the episode is censored."""

    termination: Literal["invalid", "context_limit"] = "context_limit"
