"""What an episode will hold in each role's KV cache before it has made a call: admission's first guess.

The admission (admission.py) counts what an in-flight episode holds from the
calls it made. Before an episode's first turn there is nothing to count, yet
the admission must decide at start-up how many episodes to run at once. The
guess comes from what the rig can compute without running anything: the
opening prompt (its template filled from the spec, or from the checkpoint's
state on resume), plus the visible history a resumed episode carries, counted
with the role's tokenizer, once for each stage the role is asked every turn.
Most stages' prompts hold the story material and the history, so this is the
right size; the admission rescales it by what the first turns measured.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ..engines.base import Message
from ..protocol.episode import Checkpoint
from ..protocol.ledger import initial_state
from ..protocol.prompts import PromptPack, format_history, opening_vars
from ..protocol.spec import Spec
from ..protocol.stages import STAGES

Count = Callable[[Sequence[Message]], int]

# Stages every turn asks of each role: the narrator's narration, the player, the audits. The
# double-check runs only when the conflict check finds one, a narrator method's own stages replace
# or join the narration (the rescaling absorbs both).
PER_TURN: dict[str, int] = {}
for _s in STAGES.values():
    if _s.method is None and _s.name not in ("opening", "double_check") and _s.role != "builder":
        PER_TURN[_s.role] = PER_TURN.get(_s.role, 0) + 1


def counter(engine: Any) -> Count:
    """The engine's own token count of a prompt; without a tokenizer, about four characters a token."""
    count = getattr(engine, "count_tokens", None)
    if callable(count):
        return count
    tokenize = getattr(engine, "tokenize", None)
    if callable(tokenize):
        return lambda messages: len(tokenize(messages))
    return lambda messages: sum(len(m.content) for m in messages) // 4 + 1


def estimate(spec: Spec, checkpoint: Checkpoint | None, pack: PromptPack,
             counts: Mapping[str, Count]) -> dict[str, int]:
    """Tokens the episode's prompts will hold per role (for the roles in `counts`) over its next turn:
    a fresh one its opening and turn 0, a resumed one the turn after its checkpoint."""
    state = checkpoint.state if checkpoint is not None else initial_state(spec)
    opening = pack.render("opening", opening_vars(spec, state))
    history = format_history(state.opening, ((e.player_input, e.response) for e in state.exchanges))
    out: dict[str, int] = {}
    for role, count in counts.items():
        stages = PER_TURN.get(role, 0) + (1 if checkpoint is None and role == "narrator" else 0)
        if stages:
            per_stage = count(opening) + (count((Message("user", history),)) if history else 0)
            out[role] = stages * per_stage
    return out
