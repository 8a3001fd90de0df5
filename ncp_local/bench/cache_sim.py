"""The hit rate an unbounded prefix cache would give: the benches' yardstick for eviction."""

from __future__ import annotations

import hashlib
from typing import Any

from ..engines.base import Request


def unbounded_cache_hit(requests: list[Request], tokenize: Any, block: int) -> dict[int, tuple[int, int]]:
    """(prompt, hit) tokens by turn if the prefix cache kept every full block it ever computed.

    Requests in the order they reached the engine; a block hits when the same
    token prefix through that block was seen before (vLLM's block hashing).
    """
    seen: set[bytes] = set()
    by_turn: dict[int, tuple[int, int]] = {}
    for r in requests:
        ids = tokenize(r.messages)
        h = hashlib.sha256()
        hit, hitting = 0, True
        for start in range(0, len(ids) - len(ids) % block, block):
            h.update(repr(ids[start : start + block]).encode())
            key = h.digest()
            if hitting and key in seen:
                hit += block
            else:
                hitting = False
                seen.add(key)
        # vLLM always computes at least the last prompt token itself.
        hit = min(hit, max(0, len(ids) - 1) // block * block)
        p, c = by_turn.get(r.tags.get("turn", 0), (0, 0))
        by_turn[r.tags.get("turn", 0)] = (p + len(ids), c + hit)
    return by_turn
