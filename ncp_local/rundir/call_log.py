"""The call log, `calls.jsonl`: one line per attempt of one model call, its shape and its reader.

No result depends on the log; the cost report, the analysis tables, the Inspect export, the
projections and the benches read it. They read it as `CallLine`s, so a field is named once, here,
with its type, instead of as a string in every reader's `.get`.

A line keeps only the keys its attempt had (`exclude_unset`): a call that overflowed the window never
reached the engine and has no token counts; a thought, a bound hit, a retried transport error, a
speculative call are written only when they happened. Trial 0 is left out so a run without trials
writes the lines it always wrote. Lines of older rigs may carry keys this one no longer reads: they
are ignored, not refused (the format version says when a line cannot be read, rundir/formats.py).
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


def call_summary(calls_path: str | Path) -> list[str]:
    """The call log in words: calls per stage, then, for a stage where something happened, how many
    answers were cut at their token bound (and after how long), failed otherwise, or were retried;
    then tokens (prompt, cached, generated, hit rate)."""
    if not Path(calls_path).exists():
        return []
    calls = read_calls(calls_path)
    by_stage: dict[str, list[CallLine]] = {}
    for c in calls:
        by_stage.setdefault(c.stage, []).append(c)
    # A call is a question to a model; its retries are further attempts of the same call (as in the
    # report's cost table), said apart below.
    lines = [f"calls: {_asked(calls)} (" + ", ".join(f"{k} {_asked(v)}" for k, v in by_stage.items()) + ")"]
    for stage, cs in by_stage.items():
        said = _stage_events(cs)
        if said:
            lines.append(f"  {stage}: {_count(_asked(cs), 'call')}, " + ", ".join(said))
    prompt = sum(c.prompt_tokens or 0 for c in calls)
    cached = sum(c.cached_tokens or 0 for c in calls)
    lines.append(
        f"tokens: prompt={prompt} cached={cached} generated={sum(c.generated_tokens or 0 for c in calls)}"
        + (f" cache_hit={cached / prompt:.2f}" if prompt else "")
    )
    return lines


def _asked(calls: list[CallLine]) -> int:
    return sum(c.attempt == 0 for c in calls)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _stage_events(calls: list[CallLine]) -> list[str]:
    """What went other than plainly for one stage's calls, in words ([] when nothing did)."""
    said = []
    cut = [c for c in calls if c.finish_reason == "length"]
    if cut:
        bounds = sorted({c.max_tokens_sent or 0 for c in cut})
        bound = f"{bounds[0]}-token bound" if len(bounds) == 1 and bounds[0] else "token bound"
        secs = sum(c.latency_s or 0.0 for c in cut)
        said.append(
            f"1 cut at its {bound} after {secs:.0f} s"
            if len(cut) == 1
            else f"{len(cut)} cut at their {bound} after {secs:.0f} s in all"
        )
    failed = sum(c.error is not None and c.finish_reason != "length" for c in calls)
    if failed:
        said.append(f"{failed} failed")
    retried = sum(c.attempt > 0 for c in calls)
    if retried:
        said.append(f"{retried} {'retry' if retried == 1 else 'retries'}")
    return said
