"""The run's summary says in words what happened to a stage's calls: cut at their bound (and after how
long), failed otherwise, retried; a stage where nothing did is only counted."""

from __future__ import annotations

import json
from pathlib import Path

from ncp_local.rundir.call_log import call_summary


def _call(
    stage: str,
    attempt: int = 0,
    finish: str = "stop",
    error: str | None = None,
    latency: float = 1.0,
    budget: int = 512,
) -> dict:
    return {
        "spec_id": "a",
        "turn": 0,
        "role": "narrator",
        "model": "m",
        "seed": attempt,
        "stage": stage,
        "attempt": attempt,
        "finish_reason": finish,
        "error": error,
        "latency_s": latency,
        "max_tokens_sent": budget,
        "prompt_tokens": 100,
        "cached_tokens": 40,
        "generated_tokens": 10,
    }


def test_the_calls_in_words(tmp_path: Path) -> None:
    calls = [
        _call("opening"),
        _call("opening", finish="length", error="cut off at max_tokens=512", latency=80.6),
        _call("opening", attempt=1),
        _call("narrate"),
        _call("narrate"),
        _call("player", finish="length", error="cut", latency=10, budget=192),
        _call("player", attempt=1, finish="length", error="cut", latency=20, budget=192),
        _call("player", attempt=2, error="bad JSON"),
    ]
    (tmp_path / "calls.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    assert call_summary(tmp_path / "calls.jsonl") == [
        "calls: 5 (opening 2, narrate 2, player 1)",
        "  opening: 2 calls, 1 cut at its 512-token bound after 81 s, 1 retry",
        "  player: 1 call, 2 cut at their 192-token bound after 30 s in all, 1 failed, 2 retries",
        "tokens: prompt=800 cached=320 generated=80 cache_hit=0.40",
    ]
