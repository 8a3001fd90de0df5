"""The facts of the models in `conf/model/`, built in so that a plan can be made on a machine without
their weights (a laptop, a login node, CI)."""

from __future__ import annotations

from pathlib import Path

from .facts import ModelFacts

# The models of conf/model/, for when their directory is not on this machine.
# Shapes from each model's config.json; weights from its safetensors index
# (`metadata.total_size`), or from the parameter count the architecture
# gives where noted.
BUILT_IN: dict[str, ModelFacts] = {
    "qwen3-8b": ModelFacts(
        layers=36,
        heads=32,
        kv_heads=8,
        head_dim=128,
        weights_bytes=16_381_470_720,
        stored_dtype_bytes=2,
        native_window=40960,
    ),
    "qwen3-32b": ModelFacts(
        layers=64,
        heads=64,
        kv_heads=8,
        head_dim=128,
        weights_bytes=65_524_246_528,
        stored_dtype_bytes=2,
        native_window=40960,
    ),
    "llama-3.1-8b-instruct": ModelFacts(
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        weights_bytes=16_060_522_496,
        stored_dtype_bytes=2,
        native_window=131072,
    ),
    # 48 layers, every 6th global; the others attend to the last 1024 tokens.
    # Weights: language model and vision tower, 12.19 B parameters (from the architecture).
    "gemma-3-12b-it": ModelFacts(
        layers=48,
        heads=16,
        kv_heads=8,
        head_dim=256,
        weights_bytes=24_374_650_080,
        stored_dtype_bytes=2,
        native_window=131072,
        sliding_window=1024,
        sliding_layers=40,
    ),
    # 23.57 B parameters (from the architecture).
    "mistral-small-24b-instruct-2501": ModelFacts(
        layers=40,
        heads=32,
        kv_heads=8,
        head_dim=128,
        weights_bytes=47_144_806_400,
        stored_dtype_bytes=2,
        native_window=32768,
    ),
    # ---- mixture-of-experts models (conf/model/qwen3_*_a*b*.yaml, deepseek_v3_2.yaml, kimi_k2_5.yaml) ----
    # Parameters computed from each config.json's shapes (attention, routed experts, embedding and an untied
    # head; norms left out) agree with the published totals; weights not read from a safetensors index
    # are those parameters at the checkpoint's bytes, an estimate the plan replaces with the index's
    # metadata.total_size once the model is on disk.
    # Qwen3-235B-A22B (Qwen3MoeForCausalLM): 94 layers, 64 heads, 4 KV heads x 128, 128 experts, 8 per
    # token, max_position_embeddings 40960; 235.09 B parameters, 22.19 B active (the router included).
    "qwen3-235b-a22b": ModelFacts(
        layers=94,
        heads=64,
        kv_heads=4,
        head_dim=128,
        weights_bytes=470_185_672_704,
        stored_dtype_bytes=2,
        native_window=40960,
        experts=128,
        active_experts=8,
        params=235_092_836_352,
        active_params=22_189_965_312,
        expert_bytes=454_192_791_552,
    ),
    # The same in Qwen's FP8 (quantization_config fp8, 128 x 128 weight blocks with a float32 scale each);
    # embedding, head and norms in bf16: about 236 GB (estimate: 233.85 B one-byte weights, 2.49 B
    # two-byte ones, 0.06 GB of scales).
    "qwen3-235b-a22b-fp8": ModelFacts(
        layers=94,
        heads=64,
        kv_heads=4,
        head_dim=128,
        weights_bytes=236_400_000_000,
        stored_dtype_bytes=2,
        native_window=40960,
        experts=128,
        active_experts=8,
        params=235_092_836_352,
        active_params=22_189_965_312,
        quantization="fp8",
        moe_intermediate=1536,
        weight_block=128,
        expert_bytes=227_096_395_776,
    ),
    # Qwen3-30B-A3B: 48 layers, 32 heads, 4 KV heads x 128, 128 experts, 8 per token; 30.53 B
    # parameters, 3.35 B active; about 61 GB in bf16: one 80 GB GPU.
    "qwen3-30b-a3b": ModelFacts(
        layers=48,
        heads=32,
        kv_heads=4,
        head_dim=128,
        weights_bytes=61_063_823_360,
        stored_dtype_bytes=2,
        native_window=40960,
        experts=128,
        active_experts=8,
        params=30_531_911_680,
        active_params=3_352_821_760,
        expert_bytes=57_982_058_496,
    ),
    # DeepSeek-V3.2 (DeepseekV32ForCausalLM): 61 layers, 128 heads, MLA (kv_lora_rank 512 + qk_rope_head_dim
    # 64 = 576 cached elements a layer), the sparse-attention indexer (index_head_dim 128: 132 bytes),
    # 256 experts + 1 shared, 8 per token, first 3 layers dense, 1 MTP layer, max_position_embeddings
    # 163840, FP8 weights (quantization_config fp8, 128 x 128 blocks). 671 B parameters + 14 B MTP
    # (DeepSeek-V3's report; the indexer adds about 0.9 B), 37 B active. Weights about 690 GB: DeepSeek's
    # figure for the FP8 release, not read from V3.2's own index here (no copy of it was at hand).
    "deepseek-v3.2": ModelFacts(
        layers=61,
        heads=128,
        kv_heads=1,
        head_dim=576,
        weights_bytes=690_000_000_000,
        stored_dtype_bytes=2,
        native_window=163840,
        latent_dim=576,
        indexer_bytes=132,
        experts=256,
        active_experts=8,
        params=685_000_000_000,
        active_params=37_000_000_000,
        mtp_layers=1,
        mtp_bytes=690_000_000_000 // 59,
        quantization="fp8",
        moe_intermediate=2048,
        weight_block=128,
        expert_bytes=653_908_770_816,
    ),
    # Kimi-K2.5 (KimiK25ForConditionalGeneration; its language model is DeepSeek-V3's): 61 layers, 64
    # heads, MLA 512 + 64, 384 experts + 1 shared, 8 per token, window 262144, no MTP layer (not
    # verified), routed experts in INT4 (compressed-tensors, groups of 32). About 1.04 T parameters,
    # 32 B active (Moonshot's figures); about 595 GB on disk (estimate, not read from its index).
    "kimi-k2.5": ModelFacts(
        layers=61,
        heads=64,
        kv_heads=1,
        head_dim=576,
        weights_bytes=595_000_000_000,
        stored_dtype_bytes=2,
        native_window=262144,
        latent_dim=576,
        experts=384,
        active_experts=8,
        params=1_040_000_000_000,
        active_params=32_000_000_000,
        quantization="compressed-tensors",
        # INT4 with a bf16 scale per group of 32: 0.5625 bytes a parameter.
        expert_bytes=570_760_888_320,
    ),
    "smollm2-135m-instruct": ModelFacts(
        layers=30, heads=9, kv_heads=3, head_dim=64, weights_bytes=269_030_016, stored_dtype_bytes=2, native_window=8192
    ),
}


def built_in(name: str, path: str) -> ModelFacts | None:
    # By the record's name, else by its directory's name (the HF repo name, lower-cased).
    for key in (name.lower(), Path(path).name.lower()):
        if key in BUILT_IN:
            return BUILT_IN[key]
    return None
