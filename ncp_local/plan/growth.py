"""How long each stage's prompt gets, turn by turn: fitted, then projected to `max_turns`.

Nothing here is a constant of the rig's prompts. The plan plays a few turns
of the real episode code (the configured narrator method, player condition,
prompt pack and dataset) against scripted answers of a stated size, renders
every call exactly as a run would, counts its tokens with the role model's
own tokenizer, and fits a line per stage: tokens = a + b x turn. A changed
template, narrator or dataset changes the fit by itself. `plan.measured`
fits the same line to a real run's call log instead.

Turns count as people read them (protocol/turns.py): the opening is 0, then 1, 2, ... (turn N is
the N-th player turn, turn id N-1 in the call log).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..engines.base import Message, Request
from ..engines.chat_format import ChatFormat
from ..engines.scripted import RandomPolicy
from ..engines.settings import ModelSettings
from .checkpoint import model_dir


@dataclass(frozen=True)
class Line:
    """tokens = base + slope x turn."""

    base: float
    slope: float

    def at(self, turn: float) -> float:
        return self.base + self.slope * turn

    def first_over(self, limit: float, start: int, stop: int) -> int | None:
        """The first integer turn in [start, stop] where the line is above `limit`; None if none."""
        if self.at(start) > limit:
            return start
        if self.slope <= 0:
            return None
        t = math.floor((limit - self.base) / self.slope) + 1
        t = max(t, start)
        return t if t <= stop else None

    def text(self) -> str:
        return f"{self.base:.0f} + {self.slope:.0f} x turn"


def fit_line(points: Mapping[int, float]) -> Line:
    """Least-squares line through (turn, tokens); one point gives a flat line, none a zero one."""
    pts = sorted(points.items())
    if not pts:
        return Line(0.0, 0.0)
    if len(pts) == 1:
        return Line(float(pts[0][1]), 0.0)
    n = len(pts)
    mx = sum(t for t, _ in pts) / n
    my = sum(v for _, v in pts) / n
    sxx = sum((t - mx) ** 2 for t, _ in pts)
    slope = sum((t - mx) * (v - my) for t, v in pts) / sxx if sxx else 0.0
    return Line(my - slope * mx, slope)


@dataclass(frozen=True)
class StageGrowth:
    stage: str
    role: str
    line: Line  # over turns >= 1
    need: int  # output tokens the stage's longest answer took
    opening: int | None  # the prompt at turn 0, when the stage runs there
    turns: tuple[int, ...]  # the turns it was seen at

    @property
    def opening_only(self) -> bool:
        return self.turns == (0,)

    def runs_at(self, turn: int) -> bool:
        return self.opening is not None if turn == 0 else not self.opening_only

    def prompt_at(self, turn: int) -> float:
        if turn == 0 and self.opening is not None:
            return float(self.opening)
        return self.line.at(turn)


@dataclass(frozen=True)
class Growth:
    stages: dict[str, StageGrowth]
    source: str  # what was played or measured, said in the plan
    tokenizers: dict[str, str]  # role -> whose tokenizer counted


# ---- tokens ----------------------------------------------------------------------


class Counter:
    """Prompt tokens as the engine counts them: engines/chat_format.py, the one place that renders."""

    def __init__(self, chat: ChatFormat | None, label: str) -> None:
        self.chat = chat
        self.label = label

    def prompt(self, messages: Sequence[Message]) -> int:
        if self.chat is None:
            # No tokenizer on this machine at all: about 4 characters a token for English.
            return sum(len(m.content) for m in messages) // 4 + 8
        return self.chat.count(messages)

    def answer(self, text: str) -> int:
        if self.chat is None:
            return len(text) // 4 + 1
        return self.chat.count_text(text) + 1  # and the end-of-turn token

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return self.prompt(messages)


def _load_chat(path: Path, model: ModelSettings) -> ChatFormat | None:
    if not (
        (path / "tokenizer.json").is_file()
        or (path / "tokenizer_config.json").is_file()
        or any(path.glob("tekken*.json"))
    ):
        return None
    try:
        return ChatFormat.load(path, model)
    except Exception:  # a broken or partial download, no template, vLLM not importable: fall back, and say so
        return None


def counters(cfg: RunConfig, roles: Sequence[str]) -> dict[str, Counter]:
    """Each role's model tokenizer; where absent, the embedded SmolLM2's (a stand-in, said in the plan)."""
    cache: dict[tuple[Path, str], ChatFormat | None] = {}

    def chat(path: Path, model: ModelSettings) -> ChatFormat | None:
        key = (path, model.engine_key)
        if key not in cache:
            cache[key] = _load_chat(path, model)
        return cache[key]

    out = {}
    for role in roles:
        m = getattr(cfg, role).model
        where = model_dir(str(m.path))
        c = chat(where, m)
        if c is not None:
            out[role] = Counter(c, f"{m.name}'s own")
            continue
        proxy = model_dir("embedded")
        stand_in = ModelSettings(name="stand-in", path="embedded")
        c = chat(proxy, stand_in)
        label = (
            f"SmolLM2's as a stand-in (no tokenizer at {where})"
            if c is not None
            else f"about 4 characters a token (no tokenizer at {where}, nor the embedded model's)"
        )
        out[role] = Counter(c, label)
    return out


# ---- playing turns on scripted answers -------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How long the scripted answers are; the plan prints them with the fit."""

    narration_words: int
    player_words: int
    reason_words: int
    facts_per_turn: int
    fact_words: int

    @classmethod
    def of(cls, pc: Any, specs: Sequence[Any]) -> Sizes:
        """The plan settings' answer lengths (`pc`: the `plan` section), a fact as long as the specs' own."""
        facts = [len(f.content.split()) for s in specs for f in s.initial_facts]
        fact_words = max(1, round(sum(facts) / len(facts))) if facts else 12
        return cls(pc.narration_words, pc.player_words, pc.reason_words, pc.facts_per_turn, fact_words)

    def text(self) -> str:
        return (
            f"narrations of {self.narration_words} words in one paragraph, player actions of {self.player_words}, "
            f"{self.facts_per_turn} new fact(s) of {self.fact_words} words a turn, reasons of "
            f"{self.reason_words}"
        )


def words_of(specs: Sequence[Any]) -> list[str]:
    # The dataset's own prose, so that the answers tokenize like English narration does.
    words = [w for s in specs for w in s.synopsis.split()]
    return words or "the story goes on".split()


def _prose(pool: list[str], n: int, rng: random.Random, chars: int | None) -> str:
    start = rng.randrange(len(pool))
    text = " ".join(pool[(start + i) % len(pool)] for i in range(n))
    return text[:chars] if chars else text


def _resize(data: Any, fn: Callable[[str, str], str | None]) -> Any:
    """Every string under a known key replaced by fn(key, value) (None keeps it)."""
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if isinstance(v, str):
                new = fn(k, v)
                out[k] = v if new is None else new
            else:
                out[k] = _resize(v, fn)
        return out
    if isinstance(data, list):
        return [_resize(v, fn) for v in data]
    return data


def sized_answers(
    sizes: Sizes, pool: list[str], bounds: Mapping[str, Any], record: Callable[[str, str, str], None]
) -> Callable[[Request], str]:
    """A scripted answer for every stage, at the stated sizes (within the role's bounds, as a grammar would)."""
    # Every conflict check finds one conflict and every double-check overturns it: both
    # stages run every turn (their prompts are the auditor's longest) and the turn commits.
    policy = RandomPolicy(conflict_rate=1.0, overturn_rate=1.0, add_fact_rate=0.0, negate_fact_rate=0.0)

    def answer(request: Request) -> str:
        stage = str(request.tags.get("stage", ""))
        role = str(request.tags.get("role", ""))
        b = bounds.get(role)
        rng = random.Random(request.seed)

        def bound(name: str) -> int | None:
            return getattr(b, name, None) if b is not None else None

        if stage == "player":
            text = _prose(pool, sizes.player_words, rng, bound("player_chars"))
            record(stage, role, text)
            return text
        data = json.loads(policy.answer(request))

        def resize(key: str, value: str) -> str | None:
            if key == "text":
                return _prose(pool, sizes.narration_words, rng, bound("text_chars"))
            if key == "summary":
                return _prose(pool, sizes.narration_words, rng, bound("summary_chars"))
            if key in ("reason", "review_reason"):
                return _prose(pool, sizes.reason_words, rng, bound("reason_chars"))
            return None

        data = _resize(data, resize)
        if stage == "fact_update":
            most = bound("new_facts")
            n = sizes.facts_per_turn if most is None else min(sizes.facts_per_turn, most)
            data["add_facts"] = [_prose(pool, sizes.fact_words, rng, bound("fact_chars")) for _ in range(n)]
            data["negate_facts"] = []
        text = json.dumps(data, ensure_ascii=False)
        record(stage, role, text)
        return text

    return answer


def longest_specs(specs: Sequence[Any], k: int) -> tuple[Any, ...]:
    """The k specs with the most material (commitments, beats, facts): the longest prompts."""

    def size(s: Any) -> int:
        return (
            len(s.synopsis)
            + sum(
                len(c.description) + len(c.satisfaction_condition) + len(c.violation_condition) for c in s.commitments
            )
            + sum(len(n.description) + len(n.trigger_event) + len(n.key_delta) for n in s.trajectory)
            + sum(len(f.content) for f in s.initial_facts)
        )

    return tuple(sorted(specs, key=lambda s: (-size(s), s.id))[:k])


def fit(
    prompts: dict[str, dict[int, int]],
    need: dict[str, int],
    role_of: dict[str, str],
    source: str,
    tokenizers: dict[str, str],
) -> Growth:
    stages = {}
    for stage, by_turn in prompts.items():
        later = {t: float(v) for t, v in by_turn.items() if t >= 1}
        line = fit_line(later) if later else Line(float(by_turn.get(0, 0)), 0.0)
        stages[stage] = StageGrowth(
            stage=stage,
            role=role_of.get(stage, ""),
            line=line,
            need=need.get(stage, 0),
            opening=by_turn.get(0),
            turns=tuple(sorted(by_turn)),
        )
    return Growth(stages=stages, source=source, tokenizers=tokenizers)
