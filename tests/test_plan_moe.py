"""The plan for mixture-of-experts and MLA models (the paper's open-weight narrators), on the CPU.

- MLA's KV cache per token and GPU is what vLLM's own layers say it is: the plan's figure for
  DeepSeek-V3.2 and Kimi-K2.5 equals the page of the spec objects that vLLM's `MLAAttention` and
  `DeepseekV32IndexerCache` build (their own `get_kv_cache_spec`, called on stand-in layers), for
  bf16, fp8 and fp8_ds_mla, and it does not shrink with tensor parallel; vLLM's own grouping of 61
  latent + 61 indexer layers gives the plan's one-request figure;
- GQA KV heads are replicated when tensor parallel exceeds them (Qwen3-235B-A22B at 8);
- a model folder (config.json + model.safetensors.index.json) gives latent, indexer, experts, MTP
  layers and the quantization, and a quantized checkpoint is loaded at its stored size, less MTP;
- `8xH200-141GB` is eight GPUs;
- the guide's DeepSeek-V3.2 command (docs/guide/models-and-gpus.md) goes on 8 x H200; on 8 x H100-80GB it stops
  in one line saying the weights do not fit and what would; Qwen3-235B-A22B and Kimi-K2.5 go on 8 x H200;
- block-FP8 experts sliced past whole blocks are refused where vLLM's own load check refuses them;
- data parallel inside one engine: vLLM's own engine arguments and parallel config take the rig's
  settings, the plan gives tensor parallel x data parallel devices and counts every replica's KV cache,
  and vLLM slices the devices per replica as the plan laid them out.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
from omegaconf import OmegaConf

from ncp_local import config as config_mod
from ncp_local import plan as plan_mod
from ncp_local.config import ConfigError
from ncp_local.engines.settings import ModelSettings
from ncp_local.plan.checkpoint import model_facts
from ncp_local.plan.hardware import GIB, inventory
from ncp_local.plan.known_models import BUILT_IN
from ncp_local.plan.memory import apply

H200 = "plan.gpus=[8xH200-141GB]"
H100 = "plan.gpus=[8xH100-80GB]"
# The guide's command for the paper's DeepSeek-V3.2 row with a local Qwen3-32B auditor beside it.
DEEPSEEK = [
    "experiment=paper",
    "narrator=deepseek_v3_2",
    "player=deepseek_v3_2",
    "auditor=qwen3_32b",
    "auditor.model.tensor_parallel_size=8",
]


def cfg_for(overrides: list[str]) -> Any:
    raw = OmegaConf.to_container(config_mod.compose(overrides), resolve=True)
    return config_mod.validate(raw)  # type: ignore[arg-type]


def engine(overrides: list[str], role: str = "narrator") -> Any:
    p = plan_mod.check(cfg_for(overrides))
    e = p.engine_for(role)
    assert e is not None and e.kv is not None
    return p, e


# ---- MLA: vLLM's own layers say what a token costs ----------------------------------------------------


def _vllm_mla_token_bytes(kv_cache_dtype: str, indexer: bool) -> int:
    """One layer's bytes per token as vLLM's MLA layer (and V3.2's indexer cache layer) describe
    themselves to the KV cache manager: their own get_kv_cache_spec on stand-in layer objects."""
    torch = pytest.importorskip("torch")
    mla = pytest.importorskip("vllm.model_executor.layers.attention.mla_attention")
    ds = pytest.importorskip("vllm.model_executor.models.deepseek_v2")
    config = NS(cache_config=NS(block_size=16), model_config=NS(dtype=torch.bfloat16))
    layer = NS(
        kv_cache_dtype=kv_cache_dtype,
        head_size=512 + 64,
        sliding_window=None,
        indexer=object() if indexer else None,
        non_causal_multi_token_decode=False,
        topk_buffer_width=None,
    )
    page = mla.MLAAttention.get_kv_cache_spec(layer, config).page_size_bytes
    if indexer:
        # Indexer(): head_dim = index_head_dim + index_head_dim // quant_block_size * 4, uint8.
        cache = NS(cache_config=config.cache_config, head_dim=128 + 128 // 128 * 4, dtype=torch.uint8)
        page += ds.DeepseekV32IndexerCache.get_kv_cache_spec(cache, config).page_size_bytes
    return page // 16


def _sparse_mla_cache_dtype(kv_cache_dtype: str) -> str:
    """What V3.2's sparse MLA layer stores for a requested kv_cache_dtype on Hopper (FlashMLA sparse)."""
    mla = pytest.importorskip("vllm.model_executor.layers.attention.mla_attention")
    backend = NS(get_name=lambda: "FLASHMLA_SPARSE")
    return mla._canonicalize_sparse_mla_kv_cache_dtype(backend, kv_cache_dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "fp8_ds_mla"])
def test_deepseek_v3_2_kv_per_token_is_vllms_own_figure(kv_cache_dtype: str) -> None:
    extra = (
        []
        if kv_cache_dtype == "auto"
        else [
            f"+narrator.model.engine_args.kv_cache_dtype={kv_cache_dtype}",
            f"+player.model.engine_args.kv_cache_dtype={kv_cache_dtype}",
        ]
    )
    _, e = engine(DEEPSEEK + [H200] + extra)
    stored = _sparse_mla_cache_dtype(kv_cache_dtype)
    per_layer = _vllm_mla_token_bytes(stored, indexer=True)
    assert per_layer == {"auto": 1152 + 132, "fp8_ds_mla": 656 + 132}[stored]
    assert e.kv.bytes_per_token() == 61 * per_layer  # 76.5 KiB in bf16, 46.9 KiB as fp8_ds_mla
    assert e.kv.page_bytes() == 16 * per_layer and e.kv.rules.startswith("vLLM")
    # The formulas (no vLLM) agree, and tensor parallel does not split the latent.
    from dataclasses import replace

    assert replace(e.kv, use_vllm=False).request_bytes() == e.kv.request_bytes()
    _, tp1 = engine(
        DEEPSEEK
        + ["narrator.model.tensor_parallel_size=1", "player.model.tensor_parallel_size=1", "plan.gpus=[B200-192GB]"]
        + extra
    )
    assert tp1.kv.bytes_per_token() == e.kv.bytes_per_token()


def test_the_latent_and_indexer_layers_group_as_vllm_groups_them() -> None:
    """61 MLA layers and 61 indexer caches are one group to vLLM (every layer full attention): one
    163840-token request takes 61 x 163840 x 1284 bytes, the plan's figure."""
    torch = pytest.importorskip("torch")
    utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    iface = pytest.importorskip("vllm.v1.kv_cache_interface")
    if not hasattr(utils, "_max_memory_usage_bytes_from_groups"):
        pytest.skip("this vLLM plans the KV cache elsewhere (0.33: kv_cache_planning, with a builder)")
    _, e = engine(DEEPSEEK + [H200])
    common = dict(block_size=16, num_kv_heads=1, max_tp_shards=1)
    specs = {}
    for i in range(61):
        specs[f"model.layers.{i}.self_attn.attn"] = iface.MLAAttentionSpec(
            **common, head_size=576, dtype=torch.bfloat16
        )
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = iface.MLAAttentionSpec(
            **common, head_size=132, dtype=torch.uint8, cache_role=iface.SparseCacheRole.INDEXER
        )
    config = NS(
        model_config=NS(max_model_len=163840),
        parallel_config=NS(decode_context_parallel_size=1),
        max_in_flight_tokens=e.kv.in_flight_tokens,
        speculative_config=None,
        scheduler_config=NS(disable_hybrid_kv_cache_manager=False),
        attention_config=NS(hisparse_config=None),
        cache_config=NS(get_resolved_kv_cache_layout=lambda: iface.KVCacheLayout.LBHNC, num_gpu_blocks_override=None),
    )
    groups = utils.get_kv_cache_groups(config, specs)
    assert len(groups) == 1
    assert utils._max_memory_usage_bytes_from_groups(config, groups) == e.kv.request_bytes() == 61 * 163840 * 1284
    utils.check_enough_kv_cache_memory(config, specs, e.window_kv())
    with pytest.raises(ValueError, match="To serve at least one request"):
        utils.check_enough_kv_cache_memory(config, specs, e.kv.request_bytes() - 1)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_kimi_k2_5_kv_is_dense_mla(kv_cache_dtype: str) -> None:
    """Kimi-K2.5 has no indexer: bf16 1152 bytes a layer, fp8 576 (dense MLA keeps one byte an element)."""
    extra = [] if kv_cache_dtype == "auto" else [f"+narrator.model.engine_args.kv_cache_dtype={kv_cache_dtype}"]
    _, e = engine(
        [
            "experiment=paper",
            "narrator=kimi_k2_5",
            "auditor=qwen3_32b",
            "auditor.model.tensor_parallel_size=8",
            "player=kimi_k2_5",
            H200,
        ]
        + extra
    )
    if kv_cache_dtype == "fp8":
        _, e = engine(
            [
                "experiment=paper",
                "narrator=kimi_k2_5",
                "auditor=qwen3_32b",
                "player=qwen3_32b",
                "auditor.model.tensor_parallel_size=8",
                "player.model.tensor_parallel_size=8",
                H200,
            ]
            + extra
        )
    assert e.kv.bytes_per_token() == 61 * _vllm_mla_token_bytes(kv_cache_dtype, indexer=False)
    assert e.kv.request_bytes() == 61 * 262144 * {"auto": 1152, "fp8": 576}[kv_cache_dtype]


def test_gqa_kv_heads_are_replicated_past_tensor_parallel() -> None:
    """Qwen3-235B-A22B: 4 KV heads at tensor parallel 8 are one a GPU, 47 KiB/token (vLLM's figure)."""
    vllm_config = pytest.importorskip("vllm.config")
    iface = pytest.importorskip("vllm.v1.kv_cache_interface")
    torch = pytest.importorskip("torch")
    _, e = engine(
        [
            "experiment=paper",
            "narrator=qwen3_235b_a22b",
            "player=qwen3_235b_a22b",
            "auditor=qwen3_32b",
            "auditor.model.tensor_parallel_size=8",
            H200,
        ]
    )
    heads = vllm_config.ModelConfig.get_num_kv_heads(
        NS(use_mla=False, model_arch_config=NS(total_num_kv_heads=4)), NS(tensor_parallel_size=8)
    )
    spec = iface.FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=128, dtype=torch.bfloat16)
    assert heads == e.kv.kv_heads == 1
    assert e.kv.bytes_per_token() == 94 * spec.page_size_bytes // 16 == 48128


# ---- facts from a model folder ----------------------------------------------------------------------------


def _folder(tmp_path: Path, config: dict[str, Any], total: int) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": {}}))
    return d


V32_CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "q_lora_rank": 1536,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "first_k_dense_replace": 3,
    "num_nextn_predict_layers": 1,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
}


def test_a_quantized_mla_folder_is_read_and_loaded_as_stored(tmp_path: Path) -> None:
    total = 689_000_000_000
    d = _folder(tmp_path, V32_CONFIG, total)
    f = model_facts("deepseek-v3.2", str(d))
    assert f is not None and f.on_disk
    assert (f.latent_dim, f.indexer_bytes, f.kv_heads, f.heads, f.experts, f.active_experts) == (
        576,
        132,
        1,
        128,
        256,
        8,
    )
    assert (f.quantization, f.mtp_layers, f.native_window, f.weights_bytes) == ("fp8", 1, 163840, total)
    assert (f.moe_intermediate, f.weight_block) == (2048, 128)
    assert f.mtp_bytes == total // 59 and f.loaded_bytes == total - total // 59  # one MoE layer's share of 58 + 1
    _, e = engine(DEEPSEEK + [H200, f"narrator.model.path={d}", f"player.model.path={d}"])
    # FP8 weights stay FP8: the stored bytes (less the MTP layer), not the parameters at bf16.
    assert e.weights_bytes == f.loaded_bytes and e.facts.source.startswith("read from")
    assert e.kv.bytes_per_token() == 61 * 1284


def test_a_bf16_moe_folder_gives_total_and_active_parameters(tmp_path: Path) -> None:
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "hidden_size": 2048,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
    }
    f = model_facts("qwen3-30b-a3b", str(_folder(tmp_path, cfg, 61_063_823_360)))
    assert f is not None and f.quantization is None and f.latent_dim == 0
    assert f.params == 30_531_911_680 == BUILT_IN["qwen3-30b-a3b"].params
    # All parameters less 120 of 128 experts' matrices: 3.35 B (router included), Qwen's "3.3B activated".
    assert f.active_params == BUILT_IN["qwen3-30b-a3b"].active_params
    assert f.kv_bytes_per_token(2) == 48 * 2 * 4 * 128 * 2


# ---- inventories -----------------------------------------------------------------------------------


def test_a_count_prefix_is_that_many_gpus() -> None:
    inv = inventory(["8xH200-141GB"])
    assert len(inv.gpus) == 8 and {g.name for g in inv.gpus} == {"H200"} and inv.gpus[0].total_bytes == 141 * GIB
    assert inv.describe().startswith("8 x H200 141 GiB")
    mixed = inventory(["2xH100-80GB", "A100-40GB", "2*L4-24GB"])
    assert [g.name for g in mixed.gpus] == ["H100", "H100", "A100", "L4", "L4"]
    assert len(inventory(["H100-80GB", "H100-80GB"]).gpus) == 2  # the old spelling
    for bad in ("0xH100-80GB", "100xH100-80GB", "8xH100"):
        with pytest.raises(ConfigError):
            inventory([bad])


# ---- the paper's open-weight narrators on 8 x H200 ------------------------------------------------------


@pytest.mark.parametrize("model", ["deepseek_v3_2", "kimi_k2_5", "qwen3_235b_a22b", "qwen3_235b_a22b_fp8"])
def test_the_paper_narrators_go_on_8_h200(model: str) -> None:
    p, e = engine(
        [
            "experiment=paper",
            f"narrator={model}",
            f"player={model}",
            "auditor=qwen3_32b",
            "auditor.model.tensor_parallel_size=8",
            H200,
        ]
    )
    assert not p.fatal, [x.message for x in p.fatal]
    assert e.devices == tuple(range(8)) and e.kv_bytes >= e.window_kv()
    assert all(sum(x.share for x in p.engines if d in x.devices) <= 0.9 + 0.002 for d in range(8))


def test_deepseek_v3_2_on_8_h100_says_the_weights_do_not_fit_and_what_would(capsys: pytest.CaptureFixture[str]) -> None:
    p = plan_mod.check(cfg_for(DEEPSEEK + [H100]))
    first = p.fatal[0]
    assert first.field == "narrator" and "its weights (631.7 GiB, 79.0 GiB a GPU" in first.message
    assert "do not fit GPUs of 80.0 GiB" in first.message
    assert "run on 8 x H200-141GB (plan.gpus=[8xH200-141GB]), which holds them" in first.message
    assert "\n" not in first.message
    # Kimi-K2.5 too (69 GiB of INT4 weights a GPU, plus the overhead, over 72 GiB usable... with one request).
    kimi = plan_mod.check(cfg_for(["experiment=paper", "narrator=kimi_k2_5", "player=kimi_k2_5", H100]))
    assert kimi.fatal and "8 x H200-141GB" in kimi.fatal[0].message


def test_a_tensor_parallel_2_auditor_beside_a_tensor_parallel_8_narrator_is_told_to_spread() -> None:
    """The issue's command as written: Qwen3-32B at tensor parallel 2 crowds GPUs 0 and 1 of the narrator's
    8; the one line names the auditor's tensor parallel that fits beside it on every GPU."""
    p = plan_mod.check(
        cfg_for(["experiment=paper", "narrator=deepseek_v3_2", "player=deepseek_v3_2", "auditor=qwen3_32b", H200])
    )
    first = p.fatal[0]
    assert first.field == "auditor.model.tensor_parallel_size"
    assert "set auditor.model.tensor_parallel_size=8" in first.message


# ---- data parallel inside one engine -----------------------------------------------------------------------


def test_data_parallel_builds_vllms_own_arguments_and_parallel_config(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    from ncp_local.engines.vllm_args import engine_kwargs

    model = ModelSettings(
        name="m",
        path="embedded",
        max_model_len=4096,
        tensor_parallel_size=2,
        data_parallel_size=2,
        enable_expert_parallel=True,
        devices=[4, 5, 6, 7],
    )
    args = AsyncEngineArgs(**engine_kwargs(model, tmp_path, on_cpu=False))
    assert (args.tensor_parallel_size, args.data_parallel_size, args.enable_expert_parallel) == (2, 2, True)
    assert args.device_ids == [4, 5, 6, 7]
    parallel = ParallelConfig(tensor_parallel_size=2, data_parallel_size=2, enable_expert_parallel=True)
    assert (parallel.world_size, parallel.world_size_across_dp) == (2, 4)
    with pytest.raises(ValueError, match="give exactly 4"):
        ModelSettings(name="m", path="embedded", tensor_parallel_size=2, data_parallel_size=2, devices=[0, 1])


def test_the_plan_lays_out_tensor_x_data_parallel_as_vllm_slices_it() -> None:
    """Qwen3-30B-A3B, 4 replicas on 4 x H100: the plan takes 4 GPUs, gives each the dense weights whole and a
    quarter of the experts (vLLM shards MoE layers over all 4) and its own KV cache, counts the 4 caches,
    and vLLM hands replica r the r-th run of tensor_parallel_size devices."""
    utils = pytest.importorskip("vllm.v1.engine.utils")
    one = ["experiment=paper", "narrator=qwen3_30b_a3b", "player=qwen3_30b_a3b", "auditor=qwen3_30b_a3b"]
    _, single = engine(one + ["plan.gpus=[H100-80GB]"])
    p, e = engine(
        one
        + [
            "narrator.model.data_parallel_size=4",
            "player.model.data_parallel_size=4",
            "auditor.model.data_parallel_size=4",
            "plan.gpus=[4xH100-80GB]",
        ]
    )
    assert not p.fatal and e.devices == (0, 1, 2, 3) and e.gpus == 4
    f = BUILT_IN["qwen3-30b-a3b"]
    assert e.weights_bytes == single.weights_bytes == f.weights_bytes
    assert e.weights_at(1) == f.weights_bytes - f.expert_bytes + f.expert_bytes // 4 < single.weights_at(1)
    assert e.kv_bytes > single.kv_bytes  # the experts' room goes to each replica's KV cache
    assert e.capacity_tokens() == 4 * e.kv.capacity_tokens(e.kv_bytes)
    planned = apply(p.cfg, p.engines).narrator.model
    assert planned.devices == [0, 1, 2, 3]
    for r in range(4):
        assert utils.get_physical_gpu_ids_for_local_dp_rank(
            "CUDA_VISIBLE_DEVICES", r, 1, user_assigned_gpu_ids=planned.devices
        ) == [r]
    # Too many replicas for the GPUs: one line naming data_parallel_size.
    bad = plan_mod.check(
        cfg_for(
            one
            + [
                "narrator.model.data_parallel_size=4",
                "player.model.data_parallel_size=4",
                "auditor.model.data_parallel_size=4",
                "plan.gpus=[2xH100-80GB]",
            ]
        )
    )
    assert bad.fatal[0].field.endswith("data_parallel_size") and "=2" in bad.fatal[0].message


def test_the_mtp_layer_is_one_vllm_skips_without_speculative_decoding() -> None:
    """vLLM's DeepSeek model loads num_hidden_layers layers and skips every weight its own helper names as
    a speculative-decoding layer (layer 61 of V3.2); the plan leaves exactly those out."""
    utils = pytest.importorskip("vllm.model_executor.models.utils")
    config = NS(num_hidden_layers=61, num_nextn_predict_layers=1)
    assert utils.get_spec_layer_idx_from_weight_name(config, "model.layers.61.mlp.experts.0.gate_proj.weight") == 61
    assert utils.get_spec_layer_idx_from_weight_name(config, "model.layers.60.mlp.experts.0.gate_proj.weight") is None
    f = BUILT_IN["deepseek-v3.2"]
    _, e = engine(DEEPSEEK + [H200])
    assert (f.layers, f.mtp_layers) == (61, 1) and e.kv.layers == 61
    assert e.weights_bytes == f.weights_bytes - f.mtp_bytes
    assert any("multi-token-prediction" in n for n in e.notes)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_fp8_experts_sliced_past_their_blocks_need_expert_parallel(tp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen3-235B-A22B-FP8 without expert parallel: its 1536-column experts in 128-wide FP8 blocks load at
    tensor parallel 2 and 4 and not at 8, by vLLM's own check; the plan refuses exactly where vLLM would,
    in one line naming enable_expert_parallel."""
    fp8_utils = pytest.importorskip("vllm.model_executor.layers.quantization.utils.fp8_utils")
    import vllm.distributed

    monkeypatch.setattr(vllm.distributed, "get_tensor_model_parallel_world_size", lambda: tp)
    try:
        fp8_utils.validate_fp8_block_shape_moe(1536 // tp, [128, 128])
        vllm_loads = True
    except ValueError:
        vllm_loads = False
    off = [
        f"{r}.model.{k}"
        for r in ("narrator", "player")
        for k in ("enable_expert_parallel=false", f"tensor_parallel_size={tp}")
    ]
    p = plan_mod.check(
        cfg_for(
            [
                "experiment=paper",
                "narrator=qwen3_235b_a22b_fp8",
                "player=qwen3_235b_a22b_fp8",
                "auditor=qwen3_32b",
                "auditor.model.tensor_parallel_size=8",
                H200,
            ]
            + off
        )
    )
    refused = [x for x in p.fatal if x.field.endswith("enable_expert_parallel")]
    assert bool(refused) == (not vllm_loads) == (tp == 8)
    if refused:
        assert (
            "set narrator.model.enable_expert_parallel=true player.model.enable_expert_parallel=true"
            in refused[0].message
        )
    # With expert parallel (the file's setting) each GPU holds whole experts: nothing to refuse.
    on = plan_mod.check(
        cfg_for(
            [
                "experiment=paper",
                "narrator=qwen3_235b_a22b_fp8",
                "player=qwen3_235b_a22b_fp8",
                "auditor=qwen3_32b",
                "auditor.model.tensor_parallel_size=8",
                H200,
            ]
        )
    )
    assert not on.fatal


def test_data_parallel_experts_shard_over_every_gpu() -> None:
    """DeepSeek-V3.2 as eight expert-parallel replicas (tensor parallel 1, data parallel 8), the layout
    vLLM's DeepSeek recipes also use: each GPU holds the attention and dense weights whole and an eighth
    of the routed experts, and its own replica's KV cache."""
    f = BUILT_IN["deepseek-v3.2"]
    dp = [
        f"{r}.model.{k}"
        for r in ("narrator", "player")
        for k in ("tensor_parallel_size=1", "data_parallel_size=8", "enable_expert_parallel=true")
    ]
    p, e = engine(
        [
            "experiment=paper",
            "narrator=deepseek_v3_2",
            "player=deepseek_v3_2",
            "auditor=qwen3_32b",
            "auditor.model.tensor_parallel_size=8",
            H200,
        ]
        + dp
    )
    assert not p.fatal, [x.message for x in p.fatal]
    assert e.devices == tuple(range(8)) and (e.tp, e.dp) == (1, 8)
    dense = f.loaded_bytes - f.expert_bytes
    assert e.weights_at(1) == dense + f.expert_bytes // 8  # not the whole 632 GiB on one GPU
    assert e.capacity_tokens() == 8 * e.kv.capacity_tokens(e.kv_bytes)
    _, tp8 = engine(DEEPSEEK + [H200])
    assert e.weights_at(1) > tp8.weights_at(8)  # replicated attention costs memory
