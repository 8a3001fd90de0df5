"""Every structured-output backend the model configs offer runs every stage's schema on the real engine.

One engine per backend (the session engine is xgrammar's, covered by the
other engine tests); one call per stage on real protocol state, all in
flight at once. outlines gets adapted schemas (engines/grammar.py): without the
adaptation every call fails before a token (its regex compiler times out on
the bounded strings). Content quality is not asserted (a 135M model).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import ask_all, embedded_roles, stage_calls

from ncp_local.protocol.prompts import PromptPack
from ncp_local.execution.calls import CallService, RoleBinding
from ncp_local.protocol.spec import load_dataset
from ncp_local.execution.store import RunDir, read_calls

ROOT = Path(__file__).resolve().parents[2]
ROLES = embedded_roles()  # conf/*/smollm2.yaml, bounds included


class _Session:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def run(self, coro: Any, timeout: float = 900) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))


@pytest.mark.parametrize("backend", ["guidance", "outlines"])
def test_one_call_per_stage_parses_under_backend(backend: str, embedded_model_path: Path, tmp_path: Path) -> None:
    from ncp_local.engines.settings import ModelSettings
    from ncp_local.engines.vllm import VLLMEngine

    cfg = ModelSettings(name=f"smollm2-{backend}", path=str(embedded_model_path), max_model_len=4096,
                        kv_cache_memory_bytes=1 << 29, max_num_seqs=16, enforce_eager=True, cpu_reserved_cores=0,
                        dtype="float32", seed=0, structured_outputs_backend=backend)
    loop = asyncio.new_event_loop()
    session = _Session(loop)
    engine = session.run(VLLMEngine.start(cfg), timeout=600)
    spec = load_dataset(ROOT / "specs").specs[0]
    store = RunDir(tmp_path)
    store.open({"test": True}, f"backend-{backend}")
    roles = {r: RoleBinding(engine, s, cfg.name, b) for r, (s, b) in ROLES.items()}
    calls_ = CallService(roles=roles, pack=PromptPack.load(), store=store, seed=0)
    try:
        # The spec builders add no schema feature but prefixItems + items, which build_commitments
        # has; the other two would only spend minutes writing 15 bounded nodes.
        calls = [c for c in stage_calls(spec) if c[0] not in ("build_trajectory", "build_facts")]
        answers = ask_all(session, calls_, spec.id, calls)
    finally:
        store.close()
        loop.run_until_complete(engine.close())
        loop.close()
    assert all(a is not None for a in answers)
    logged = read_calls(tmp_path / "calls.jsonl")
    # No attempt failed on the engine's side: the backend compiled every grammar it was given.
    assert not [c for c in logged if (c.get("error") or "").startswith("engine error")], logged
    assert {c["key"] for c in logged if c.get("error") is None} == {t for _, t, *_ in calls}
