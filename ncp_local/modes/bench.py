"""`mode=bench`: the rig's speed, measured as `mode=run` plays it. The ways live in `ncp_local/bench/`
(outside the command layer, as vLLM keeps its benchmarks); this is their entry."""

from __future__ import annotations

from ..bench import entry
from ..config import RunConfig


def main(cfg: RunConfig) -> int:
    return entry.main(cfg)
