"""The engine alone, one sequence against K at once (prefill and decode), and the cost projection."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from ..engines.base import Engine, Message, Request
from ..plan.growth import fit_line
from ..protocol.turns import shown as shown_turn
from .ways import PAPER_NARRATORS, PAPER_SPECS, PAPER_TURNS, Way, reset_cache


@dataclass(frozen=True)
class Scaling:
    """The engine alone: tokens/s with one sequence and with K at once."""

    k: int
    prefill_1: float
    prefill_k: float
    decode_1: float
    decode_k: float
    cap: int | None = None  # the engine's max_num_seqs, when above k
    decode_cap: float | None = None

    def best_speedup(self, uncached_prompt: int, generated: int) -> float:
        """The best one-at-a-time -> K-at-once speed-up for a workload of this token mix."""
        one = uncached_prompt / self.prefill_1 + generated / self.decode_1
        many = uncached_prompt / self.prefill_k + generated / self.decode_k
        return one / many if many else float("nan")

    def lines(self) -> list[str]:
        return [
            f"engine alone, 1 vs {self.k} sequences: prefill {self.prefill_1:.0f} vs {self.prefill_k:.0f} tok/s "
            f"(x{self.prefill_k / self.prefill_1:.2f}), decode {self.decode_1:.1f} vs {self.decode_k:.1f} tok/s "
            f"(x{self.decode_k / self.decode_1:.2f})"
            + (
                f", decode with {self.cap} (the engine's max_num_seqs, what the one-batch ceiling can fill) "
                f"{self.decode_cap:.1f} tok/s (x{self.decode_cap / self.decode_1:.2f})"
                if self.decode_cap
                else ""
            )
        ]


_WORDS = (
    "river",
    "lamp",
    "stone",
    "quiet",
    "harbor",
    "winter",
    "copper",
    "garden",
    "signal",
    "meadow",
    "tower",
    "ember",
    "violet",
    "anchor",
    "thread",
    "orchard",
    "marble",
    "lantern",
    "falcon",
    "cedar",
)


def _filler(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def engine_scaling(
    backend: Engine, k: int, seed: int, prompt_words: int = 900, decode_tokens: int = 64
) -> Scaling:
    """Prefill and decode throughput of the engine alone, one request vs k at once.

    Every prompt is distinct from its first token (no prefix hits). Decode
    requests are held to exactly `decode_tokens` by a grammar that cannot
    finish earlier (at least one character per token).
    """
    rng = random.Random(seed)

    def req(i: int, words: int, max_tokens: int, regex: str | None) -> Request:
        text = f"{i} {rng.random():.12f} " + _filler(rng, words)
        return Request(
            messages=(Message("user", text),),
            max_tokens=max_tokens,
            temperature=1.0,
            top_p=1.0,
            seed=seed + i,
            regex=regex,
            tags={"stage": "scaling"},
        )

    async def rate(reqs: list[Request], field: str) -> float:
        await reset_cache(backend)
        started = time.perf_counter()
        outs = await asyncio.gather(*(backend.generate(r) for r in reqs))
        wall = time.perf_counter() - started
        return sum(getattr(o, field) for o in outs) / wall if wall else float("nan")

    long_regex = f"[a-z ]{{{decode_tokens * 4}}}"
    prefill_1 = await rate([req(0, prompt_words, 1, None)], "prompt_tokens")
    prefill_k = await rate([req(1 + i, prompt_words, 1, None) for i in range(k)], "prompt_tokens")
    decode_1 = await rate([req(100, 8, decode_tokens, long_regex)], "generated_tokens")
    decode_k = await rate([req(101 + i, 8, decode_tokens, long_regex) for i in range(k)], "generated_tokens")
    cap = getattr(backend, "max_num_seqs", None)
    decode_cap = None
    if cap and cap > k:
        decode_cap = await rate([req(1000 + i, 8, decode_tokens, long_regex) for i in range(cap)], "generated_tokens")
    return Scaling(k, prefill_1, prefill_k, decode_1, decode_k, cap if decode_cap else None, decode_cap)


def hits_text(by_turn: dict[int, tuple[int, int]]) -> str:
    """`opening=0.73 t1=0.59 t2=0.63 ...`: cached / prompt tokens per turn (by turn id; shown as people count)."""
    return " ".join(
        f"{'opening' if t < 0 else f't{shown_turn(t)}'}={h / p:.2f}" for t, (p, h) in sorted(by_turn.items()) if p
    )


def late_hit(by_turn: dict[int, tuple[int, int]], first: int = 2) -> float:
    """Hit rate (cached / prompt tokens) over turns >= first; nan when none was played (a 2-turn bench
    has no such turn: 0.00 there read as a cache that never hit)."""
    p = sum(v[0] for t, v in by_turn.items() if t >= first)
    return sum(v[1] for t, v in by_turn.items() if t >= first) / p if p else float("nan")


def projection(rig: Way, throughput: float) -> list[str]:
    """GPU-hours for the paper grid from measured prompt tokens per turn, extrapolated linearly."""
    pts = sorted((t, p) for t, p in rig.prompt_by_turn.items() if t >= 0)
    line = fit_line(dict(pts))  # the same fit mode=plan projects windows with
    base, slope = line.base, line.slope
    per_episode = sum(max(base + slope * t, 0.0) for t in range(PAPER_TURNS))
    gen_per_turn = rig.generated_tokens / max(1, rig.turns)
    total = PAPER_NARRATORS * PAPER_SPECS * (per_episode + gen_per_turn * PAPER_TURNS)
    hit = rig.cached_tokens / rig.prompt_tokens if rig.prompt_tokens else 0.0
    hours = total / throughput / 3600
    return [
        f"projection: prompt tokens/turn = {base:.0f} + {slope:.0f} x turn id (measured over turns "
        f"{shown_turn(pts[0][0]) if pts else 0}-{shown_turn(pts[-1][0]) if pts else 0}), "
        f"{gen_per_turn:.0f} generated/turn",
        f"projection: paper grid {PAPER_NARRATORS} narrators x {PAPER_SPECS} specs x {PAPER_TURNS} turns "
        f"(upper bound: no early ends) = {total / 1e9:.2f} G tokens; at {throughput:.0f} tok/s per GPU: "
        f"{hours:.0f} GPU-hours ({hours * (1 - hit):.0f} if the {hit:.0%} cache hit rate saves its prefill)",
    ]
