"""The call log, `calls.jsonl`: one line per attempt of one model call, its shape and its reader.

No result depends on the log; the cost report, the analysis tables, the Inspect export, the
projections and the benches read it. They read it as `CallLine`s, so a field is named once, here,
with its type, instead of as a string in every reader's `.get`.

A line keeps only the keys its attempt had (`exclude_unset`): a call that overflowed the window never
reached the engine and has no token counts; a thought, a bound hit, a retried transport error, a
speculative call are written only when they happened. Trial 0 is left out so a run without trials
writes the lines it always wrote. Lines of older rigs may carry keys this one no longer reads: they
are ignored, not refused (the format version says when a line cannot be read, execution/formats.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from .formats import check_version


class CallLine(BaseModel):
    """One attempt of one call: who asked what, with which seed, and what came back."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    spec_id: str
    trial: int = 0  # which play of the story (protocol/trials.py); absent for trial 0
    turn: int  # protocol/turns.py: the reference's turn id, OPENING for the opening
    stage: str
    role: str
    model: str = ""  # the role's model label (bindings.Binding.label); lines before 2026-12-01 have none
    attempt: int
    seed: int  # the attempt's own (execution/calls.py call_seed)
    key: str = ""  # tells apart two calls of one stage in one turn (a retrieval, a re-ask)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    generated_tokens: int | None = None
    max_tokens_sent: int | None = None  # what the window left of the stage's budget
    latency_s: float | None = None
    done_at: float | None = None  # wall clock, seconds since the epoch
    overhead_s: float | None = None  # the rig's own time for this attempt (render, schema, parse, log)
    finish_reason: str | None = None
    error: str | None = None  # None: the answer was accepted
    output: str | None = None  # the raw answer of a rejected attempt
    grammar_new: bool | None = None  # the engine compiled this grammar for this call
    bound_hits: tuple[str, ...] = ()
    transport_errors: tuple[str, ...] = ()  # an endpoint's errors retried before this answer
    thought_tokens: int | None = None
    thought: str | None = None  # a thinking model's thought, whole (only its size reaches the episode)
    speculative: bool = False  # asked ahead and not used (execution/calls.py TurnAsk)

    def to_line(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_unset=True), ensure_ascii=False)


class CrossCheckNote(BaseModel):
    """`mode=build`: a round whose answer failed the build's cross-checks (not an attempt of a call)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec_id: str
    stage: str
    round: int
    cross_check_errors: tuple[str, ...]

    def to_line(self) -> str:
        return json.dumps(self.model_dump(mode="json"), ensure_ascii=False)


def read_calls(path: str | Path) -> list[CallLine]:
    """The call log's attempts, skipping a line that is not a whole record: cut short by a kill, or torn
    by a full or failing disk (not JSON, not UTF-8, not an object, not a call's fields). The log is a
    record of attempts, one line each, that no result depends on, so a damaged line costs that line
    only. A build's cross-check notes are not attempts (no turn, attempt or seed): left out the same way."""
    out = []
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if not isinstance(record, dict):
                continue
            check_version(path, record, "calls")
            try:
                out.append(CallLine.model_validate(record))
            except ValidationError:
                continue
    return out
