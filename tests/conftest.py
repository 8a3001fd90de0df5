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


@pytest.fixture(scope="session")
def official_prompts() -> Path:
    """A clone of the reference repository's prompt files, from NCP_BENCH_REFERENCE (set by .ci/run)."""
    path = os.environ.get("NCP_BENCH_REFERENCE")
    if not path or not (Path(path) / "src" / "ncpbench" / "prompts").is_dir():
        pytest.skip("official prompt files not available (set NCP_BENCH_REFERENCE to a reference clone)")
    return Path(path)
