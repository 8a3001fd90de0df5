"""HiAgent: a narrator with hierarchical working memory.

Each answer names the subgoal the narrator is pursuing along with its
narration (the action). When the subgoal changes, the finished one is
compressed into a short summary, computed once and kept in the narrator's
state (so a resumed run never recomputes it). The narrator sees finished
subgoals as summaries and the current subgoal in full, and may ask to
retrieve one compressed subgoal's full exchanges. The memory is trimmed to a
token budget counted with the narrator model's own tokenizer.

The memory comes alongside the baseline narrator's turn context (current
node, commitments, facts, its own past passages, this input), never instead
of it: the prompt is the pack's narrator template (`hiagent_narrate`, or
`narrate` when the pack has no method-specific one, as the reference's two
method templates are the same) followed by the `hiagent_memory` block.

The exchanges themselves are never copied: subgoals hold index ranges into
the episode's committed history, so memory can never disagree with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from ..chat import Message
from .ledger import EpisodeState, Exchange
from .narrators import NarratorOptions
from .prompts import PromptPack, format_history, narrate_vars, opening_vars
from .spec import Spec
from .stages import AuditIds, HiAgentStep, Narration, Summary, method_templates

DEFAULT_BUDGET = 2048


class HiAgentOptions(NarratorOptions):
    budget_tokens: int = Field(DEFAULT_BUDGET, gt=0)  # the working memory's size, in the model's tokens


class Subgoal(BaseModel):
    title: str
    start: int  # index of its first exchange in the committed history
    end: int | None = None  # exclusive; None while it is the current subgoal
    summary: str | None = None


def _same(a: str, b: str) -> bool:
    return " ".join(a.lower().split()).strip(" .") == " ".join(b.lower().split()).strip(" .")


class HiAgentNarrator:
    TEMPLATES = method_templates("hiagent")  # its stages in the registry (protocol/stages/_registry.py)
    Options = HiAgentOptions

    def __init__(
        self,
        pack: PromptPack,
        roles: dict[str, Any] | None = None,
        budget_tokens: int = DEFAULT_BUDGET,
        history: str = "full",
        **_: Any,
    ) -> None:
        self.pack = pack
        self.budget = budget_tokens
        self.first_line_history = history == "first_line"
        backend = roles["narrator"].backend if roles else None
        counter = getattr(backend, "count_tokens", None)
        # The model's own tokenizer when the backend has one; else a rough
        # 4-characters-per-token estimate (scripted backend only).
        self.count: Callable[[str], int] = (
            (lambda text: counter((Message("user", text),))) if counter else (lambda text: len(text) // 4 + 1)
        )
        self.subgoals: list[Subgoal] = []

    # -- checkpointing -------------------------------------------------------
    def save(self) -> dict[str, Any]:
        return {"subgoals": [s.model_dump() for s in self.subgoals]}

    def restore(self, data: dict[str, Any]) -> None:
        self.subgoals = [Subgoal.model_validate(s) for s in data.get("subgoals", [])]

    # -- memory ----------------------------------------------------------------
    def _block(self, i: int, sg: Subgoal, exchanges: tuple[Exchange, ...], expanded: bool) -> str:
        end = len(exchanges) if sg.end is None else sg.end
        if sg.end is not None and not expanded:
            return f"[subgoal {i}, done] {sg.title}\nSUMMARY: {sg.summary}"
        label = "current" if sg.end is None else "done, retrieved in full"
        body = "\n\n".join(f"PLAYER: {e.player_input}\n\nNARRATOR: {e.response}" for e in exchanges[sg.start : end])
        return f"[subgoal {i}, {label}] {sg.title}\n{body}".rstrip()

    def memory(self, state: EpisodeState, retrieved: int | None = None) -> str:
        """The subgoals (oldest dropped first) within the token budget."""
        blocks = [self._block(i, sg, state.exchanges, i == retrieved) for i, sg in enumerate(self.subgoals)]
        if not blocks:
            return "(no subgoal yet: the story has just opened)"
        dropped = 0
        while True:
            note = [f"({dropped} earlier subgoal(s) trimmed from memory)"] if dropped else []
            text = "\n\n".join([*note, *blocks[dropped:]])
            # Never drop the current subgoal: it is what the narrator is doing now.
            if self.count(text) <= self.budget or dropped >= len(blocks) - 1:
                return text
            dropped += 1

    def retrievable(self) -> tuple[int, ...]:
        return tuple(i for i, sg in enumerate(self.subgoals) if sg.end is not None)

    # -- the narrator interface --------------------------------------------------
    async def opening(self, spec: Spec, state: EpisodeState, ask: Any) -> str:
        out: Narration = await ask("opening", "opening", opening_vars(spec, state))
        return out.text.strip()

    async def respond(self, spec: Spec, state: EpisodeState, player_input: str, ask: Any) -> str:
        variables = {
            **narrate_vars(spec, state, player_input, self.first_line_history),
            "working_memory": self.memory(state),
        }
        step: HiAgentStep = await ask(
            "hiagent_narrate",
            "hiagent_narrate",
            variables,
            ids=AuditIds(retrievable=self.retrievable()),
            extra="hiagent_memory",
        )
        if step.retrieve is not None:
            # One retrieval per turn: expand that subgoal and answer again.
            variables["working_memory"] = self.memory(state, retrieved=step.retrieve)
            step = await ask(
                "hiagent_narrate", "hiagent_narrate", variables, ids=AuditIds(), key="retrieved", extra="hiagent_memory"
            )
        await self._advance(step.subgoal.strip(), state, ask)
        return step.text.strip()

    async def _advance(self, title: str, state: EpisodeState, ask: Any) -> None:
        turn_index = len(state.exchanges)
        current = self.subgoals[-1] if self.subgoals else None
        if current is not None and _same(current.title, title):
            return
        if current is not None:
            current.end = turn_index
            if current.end > current.start and current.summary is None:
                text = format_history(
                    "", ((e.player_input, e.response) for e in state.exchanges[current.start : current.end])
                )
                out: Summary = await ask(
                    "hiagent_summarize",
                    "hiagent_summarize",
                    {"history_text": text.removeprefix("NARRATOR: \n\n"), "subgoal": current.title},
                )
                current.summary = out.summary.strip()
            elif current.summary is None:
                current.summary = "(no exchanges)"
        self.subgoals.append(Subgoal(title=title, start=turn_index))
