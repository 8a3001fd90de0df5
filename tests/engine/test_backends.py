"""Every structured-output backend the model configs offer plays an episode on the real engine.

One engine per backend (xgrammar's episodes are the session's reference sweep,
tests/engine/test_sweep_engine.py); one spec, one turn (the opening and turn 1: every stage, and
the fact update twice), the embedded model
with the embedded role files' sampling, and the ids in the backend's form
(engines/grammar.id_form: outlines gets patterns, so each stage's schema is
the same on every call and compiled once), every role's bounds smaller than
its role file's (engine_helpers.SMALL_BOUNDS). Content quality is not asserted (a
135M model): what is asserted is that the grammar never lets through an
answer the parser rejects for its form, and, under outlines, that no stage's
grammar is compiled twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from engine_helpers import small_roles
from ncp_local.engines.grammar import id_form
from ncp_local.execution.calls import CallService, RoleBinding
from ncp_local.execution.scheduler import EpisodeScheduler, EpisodeSettings
from ncp_local.protocol.narrators import BaselineNarrator
from ncp_local.protocol.player import Player
from ncp_local.protocol.prompts import TEMPLATES, PromptPack
from ncp_local.protocol.spec import load_dataset
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.store import RunDir

ROOT = Path(__file__).resolve().parents[2]
# outlines compiles each schema into an automaton over the vocabulary, and its cost grows with item
# counts times string bounds (scripts/outlines_compile_cost.py: minutes per audit stage on the role
# file's 8 facts of 300 characters). The mechanism under test does not depend on the sizes, so every
# role's bounds here are the engine tests' small ones (engine_helpers.SMALL_BOUNDS), which also keep
# the episode's generated tokens few.
ROLES = small_roles()
# What may make an attempt invalid although the grammar held: an id of the right shape that does not
# exist (ids as patterns; the parser checks existence), and an answer cut off at the role's
# max_tokens (the role files' token budgets are below their character bounds' worst case: the
# player's 192 tokens for 350 characters, the narrator's 512 for 1000). Nothing of form: no bad
# JSON, no schema or bound failure, no engine error.
NOT_FORM = ("names unknown id", "cut off at max_tokens")


@pytest.mark.engine
@pytest.mark.timeout(1800)  # outlines compiles each stage's grammar over the vocabulary: minutes
# Both episodes are `slow` (make test-all; 70-150 s each, mostly the engine's start and the grammars'
# compiles, against CI's 25 minutes): each backend's grammar is checked against the parser without an
# engine for every stage (tests/test_grammar_agreement.py), outlines' schemas are the same call after call
# (tests/test_grammar.py), the engine arguments naming the backend are vLLM's own objects
# (tests/test_engine_args.py), and the configs' default, xgrammar, plays on the engine in the reference sweep.
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["guidance", "outlines"])
def test_an_episode_plays_under_backend(backend: str, embedded_model_path: Path, tmp_path: Path) -> None:
    from ncp_local.engines.settings import ModelSettings
    from ncp_local.engines.vllm import VLLMEngine

    cfg = ModelSettings(
        name=f"smollm2-{backend}",
        path=str(embedded_model_path),
        max_model_len=8192,
        kv_cache_memory_bytes=1 << 29,
        max_num_seqs=16,
        enforce_eager=True,
        cpu_reserved_cores=0,
        dtype="float32",
        seed=0,
        structured_outputs_backend=backend,
    )
    loop = asyncio.new_event_loop()
    engine = loop.run_until_complete(asyncio.wait_for(VLLMEngine.start(cfg), 600))
    spec = load_dataset(ROOT / "specs").specs[0]
    pack = PromptPack.load(required=TEMPLATES)
    store = RunDir(tmp_path)
    store.open({"test": True}, f"backend-{backend}")
    roles = {r: RoleBinding(engine, s, cfg.name, b, id_form(backend)) for r, (s, b) in ROLES.items()}
    runner = EpisodeScheduler(
        specs=(spec,),
        calls=CallService(roles=roles, pack=pack, store=store, seed=0),
        store=store,
        settings=EpisodeSettings(max_turns=1, concurrency=1),
        make_narrator=lambda: BaselineNarrator(pack=pack, roles=roles),
        player=Player("adversarial"),
    )
    try:
        results = loop.run_until_complete(asyncio.wait_for(runner.run(), 1500))
    finally:
        store.close()
        loop.run_until_complete(engine.close())
        loop.close()
    result = results[spec.id]
    calls = read_calls(tmp_path / "calls.jsonl")
    assert result.termination != "invalid", (result.reason, [c for c in calls if c.error])
    assert result.turns, result
    failed = [(c.stage, c.error, c.output) for c in calls if c.error and not any(why in c.error for why in NOT_FORM)]
    assert not failed, failed
    # Every constrained call says whether the engine compiled its grammar for it.
    assert all(isinstance(c.grammar_new, bool) for c in calls), calls
    if id_form(backend) == "pattern":
        new = Counter(c.stage for c in calls if c.grammar_new)
        assert max(new.values()) == 1, new  # no stage's grammar compiled twice
        audits = [
            s
            for s in ("fact_update", "conflict_check", "trajectory_check", "status_check")
            if sum(c.stage == s for c in calls) > 1
        ]
        assert audits, "the episode never called an audit stage twice"
        for stage in audits:
            assert [c.grammar_new for c in calls if c.stage == stage][1:] == [False] * (
                sum(c.stage == stage for c in calls) - 1
            ), stage
