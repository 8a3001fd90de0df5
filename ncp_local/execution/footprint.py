"""What an episode will hold in each role's KV cache before it has made a call: admission's first guess.

The admission (admission.py) measures what an in-flight episode holds from
the calls it made. Before an episode's first turn there is nothing to measure,
yet the admission must decide at start-up how many episodes to run at once.
The guess comes from what the rig can compute without running anything: every
stage a turn asks, its template filled with what the episode's state already
holds (the spec's material, the facts, a resumed episode's history; this
turn's passage and input left empty), counted with the role's tokenizer, a
prefix that stages share counted once (admission.resident), as on the engine.
The admission rescales it by what the first measured turns held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..engines.base import Message
from ..protocol.ledger import initial_state
from ..protocol.prompts import PromptPack, conflict_vars, narrate_vars, player_vars, rendered, status_vars
from ..protocol.records import Checkpoint
from ..protocol.spec import Spec
from ..protocol.stages import STAGES

Count = Callable[[Sequence[Message]], int]
Call = tuple[int, int, str]  # prompt tokens, answer tokens, prompt text (as admission.observe records)

# Stages every turn asks: the double-check runs only when the conflict check finds one, and a
# narrator method's own stages replace or join the narration (the rescaling absorbs both).
PER_TURN = tuple(
    s for s in STAGES.values() if s.method is None and s.role != "builder" and s.name not in ("opening", "double_check")
)


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return ""


def counter(engine: Any) -> Count:
    """The engine's own token count of a prompt; without a tokenizer, about four characters a token."""
    count = getattr(engine, "count_tokens", None)
    if callable(count):
        return count
    tokenize = getattr(engine, "tokenize", None)
    if callable(tokenize):
        return lambda messages: len(tokenize(messages))
    return lambda messages: sum(len(m.content) for m in messages) // 4 + 1


def text_of(messages: Sequence[Message]) -> str:
    """A prompt as one string whose prefixes are the prompt's prefixes (what the prefix cache shares)."""
    return "".join(f"{m.role}\n{m.content}\n" for m in messages)


def content_at(messages: Sequence[Message]) -> int:
    """Where the first message's content starts in `text_of(messages)`."""
    return len(messages[0].role) + 1


def estimate(
    spec: Spec, checkpoint: Checkpoint | None, pack: PromptPack, counts: Mapping[str, Count]
) -> dict[str, dict[str, Call]]:
    """Per role (those in `counts`), the prompts its stages would send over the episode's next turn:
    a fresh one's opening and turn 0, a resumed one's turn after its checkpoint."""
    state = checkpoint.state if checkpoint is not None else initial_state(spec)
    history = rendered(state, "history")
    variables = _Blank(
        {
            **narrate_vars(spec, state, ""),
            **player_vars(spec, state),
            **conflict_vars(spec, state, "", "", state.pending),
            **status_vars(spec, state, state.node_occurred, history),
        }
    )
    stages = PER_TURN + ((STAGES["opening"],) if checkpoint is None else ())
    out: dict[str, dict[str, Call]] = {}
    for stage in stages:
        count = counts.get(stage.role)
        if count is None or stage.templates[0].name not in pack.templates:
            continue
        messages = pack.render(stage.templates[0].name, variables)
        out.setdefault(stage.role, {})[stage.name] = (count(messages), 0, text_of(messages))
    return out
