"""The simulated player, one per condition (PROTOCOL section 3): it sees its role and the visible
history, nothing else."""

from __future__ import annotations

from ..errors import InputError
from .ledger import EpisodeState
from .narrators import Ask
from .prompts import player_vars
from .spec import Spec

CONDITIONS: tuple[str, ...] = ("adversarial", "natural")


class Player:
    """The simulated player for one condition; sees only the visible history."""

    def __init__(self, condition: str) -> None:
        if condition not in CONDITIONS:
            raise InputError("config", "condition", f"unknown condition {condition!r} (known: {', '.join(CONDITIONS)})")
        self.template = f"player_{condition}"

    def sees(self, spec: Spec, state: EpisodeState) -> dict[str, str]:
        """Everything the player's prompt is made of: two states it sees alike get the same call."""
        return player_vars(spec, state)

    async def act(self, spec: Spec, state: EpisodeState, ask: Ask) -> str:
        # The answer arrives cleaned (a leading label removed, quotes kept) and
        # non-empty: stages.parse retries an answer that is only a label.
        text: str = await ask("player", self.template, self.sees(spec, state))
        return text
