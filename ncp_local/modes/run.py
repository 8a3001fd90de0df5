"""`mode=run` (the default): play episodes into a run directory; the same command resumes."""

from __future__ import annotations

from typing import Any

from ..config import RunConfig
from ..execution import episodes


def main(cfg: RunConfig, raw: dict[str, Any]) -> int:
    return episodes.run(cfg, raw)
