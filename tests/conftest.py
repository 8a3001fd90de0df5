import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def official_dataset() -> Path:
    """The official NCP-Bench release, from NCP_BENCH_DATASET (set by .ci/run)."""
    path = os.environ.get("NCP_BENCH_DATASET")
    if not path or not (Path(path) / "index.yaml").exists():
        pytest.skip("official dataset not available (set NCP_BENCH_DATASET to its directory)")
    return Path(path)
