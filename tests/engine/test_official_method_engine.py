"""The official baseline narrator (the official code, imported from NCP_BENCH_REFERENCE) on the real engine with
the embedded model: one story, one turn, its calls through the rig's call service under the narrator role.

Content quality is not asserted (a 135M model). That a resumed official method ends as the uninterrupted
one is shown on the scripted engine (tests/test_official_method.py); that the real engine reproduces a call
from its seed, by tests/engine/test_vllm_engine.py; a resume on the real engine, by the served run that
resumes after its server's relay dies (tests/engine/test_mixed_engines.py). Replaying the turn here as well
doubled this test's time (74 s).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from engine_helpers import small_roles
from ncp_local.execution.calls import CallService, RoleBinding
from ncp_local.protocol.episode import Episode
from ncp_local.protocol.narrators import narrator_factory
from ncp_local.protocol.player import Player
from ncp_local.protocol.prompts import TEMPLATES, PromptPack
from ncp_local.protocol.records import Checkpoint
from ncp_local.protocol.spec import load_dataset
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.store import RunDir

ROOT = Path(__file__).resolve().parents[2]
BASELINE = "ncpbench_reference_baseline:BaselineNarrator"


def test_official_baseline_plays_on_the_engine(engine: Any, tmp_path: Path) -> None:
    reference = Path(os.environ.get("NCP_BENCH_REFERENCE") or "/nonexistent")
    paths = [reference / "src", reference / "reference-methods" / "baseline" / "src"]
    if not all(p.is_dir() for p in paths):
        pytest.skip("official sources not available (set NCP_BENCH_REFERENCE to a reference clone)")
    for p in paths:
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    spec = load_dataset(ROOT / "specs").specs[0]
    store = RunDir(tmp_path)
    store.open({"test": True}, "engine-test")
    roles = {
        r: RoleBinding(engine.backend, s, "smollm2", b) for r, (s, b) in small_roles().items()
    }  # the small bounds: the subject is the method, not the text
    service = CallService(roles=roles, pack=PromptPack.load(required=TEMPLATES), store=store, seed=0)
    method = narrator_factory(BASELINE)

    def play(checkpoints: list[Checkpoint], start: Checkpoint | None = None) -> Any:
        async def on_commit(cp: Checkpoint) -> None:
            checkpoints.append(cp)

        episode = Episode(spec, method(), Player("adversarial"), service.ask_for(spec.id), 1, on_commit)
        return engine.run(episode.run(start), timeout=900)

    whole = play([])
    assert whole.head.termination in ("conflict", "max_turns", "all_resolved", "invalid")
    store.flush()  # the call log is written by the store's writer thread
    calls = read_calls(tmp_path / "calls.jsonl")
    narrator_calls = [c for c in calls if c.role == "narrator"]
    assert {c.stage for c in narrator_calls} >= {"opening"}
    assert all(c.model == "smollm2" and c.prompt_tokens > 0 for c in narrator_calls if c.prompt_tokens is not None)
