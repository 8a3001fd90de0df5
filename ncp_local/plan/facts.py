"""What the plan needs to know about a model: its shape, its weights and its KV cache per token
(`ModelFacts`), and the bytes of the dtypes a checkpoint or an engine uses. `checkpoint.model_facts`
reads them from the model's files, else from the built-in table (`known_models.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Bytes per element of the dtypes a checkpoint or an engine uses.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "f32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "f16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "f8_e4m3": 1,
    "f8_e5m2": 1,
    "int8": 1,
    "i8": 1,
    "u8": 1,
}


@dataclass(frozen=True)
class ModelFacts:
    """One model's shape, as far as memory and context are concerned."""

    layers: int
    kv_heads: int
    head_dim: int
    weights_bytes: int  # as stored in the checkpoint
    stored_dtype_bytes: int
    native_window: int  # max_position_embeddings
    sliding_window: int | None = None  # layers with local attention hold at most this many tokens
    sliding_layers: int = 0
    rope_scaling: dict[str, Any] | None = None
    heads: int = 0  # attention heads (0: unknown); tensor parallel must divide them
    source: str = ""  # where these facts came from, said in the plan
    on_disk: bool = False  # read from the model's own directory (else the built-in table)
    # Multi-head latent attention (DeepSeek-V3 family, Kimi-K2): each layer caches one latent vector of
    # kv_lora_rank + qk_rope_head_dim elements per token, one "head" that tensor parallel does not split.
    latent_dim: int = 0  # 0: not MLA (K and V per KV head)
    # DeepSeek-V3.2's sparse-attention indexer: per layer and token, index_head_dim fp8 values and one
    # float32 scale per 128 of them (vLLM's DeepseekV32IndexerCache: 128 + 4 = 132 bytes, uint8).
    indexer_bytes: int = 0
    # Mixture of experts: routed experts, and how many each token uses.
    experts: int = 0
    active_experts: int = 0
    params: int = 0  # parameters of the checkpoint (0: unknown), MTP layers included
    active_params: int = 0  # parameters one token uses (0: unknown; dense models: all)
    # Multi-token-prediction layers the checkpoint holds beyond num_hidden_layers. vLLM's main model
    # skips their weights (deepseek_v2.py `load_weights`: "skip spec decode layers for main model")
    # and allocates them no KV cache unless speculative decoding is on.
    mtp_layers: int = 0
    mtp_bytes: int = 0  # of weights_bytes, the MTP layers' (estimated: see `_mtp_bytes`)
    # The checkpoint's own quantization (`quantization_config.quant_method`, e.g. fp8,
    # compressed-tensors): vLLM loads such weights as stored, so memory = checkpoint bytes.
    quantization: str | None = None
    # Block-quantized FP8: an expert's gate/up columns on each GPU must be whole blocks (below).
    moe_intermediate: int = 0  # moe_intermediate_size
    weight_block: int = 0  # quantization_config.weight_block_size[0] (0: not block-quantized)
    # Of weights_bytes, the routed experts' (layers x experts x 3 x hidden x moe_intermediate_size at the
    # checkpoint's bytes a parameter): vLLM shards MoE layers over tensor parallel x data parallel GPUs
    # (0.33 fused_moe/config.py `flatten_tp_across_dp_and_pcp`, or by expert with expert parallel), the
    # rest over tensor parallel only.
    expert_bytes: int = 0

    @property
    def loaded_bytes(self) -> int:
        """The weights vLLM loads without speculative decoding: the checkpoint less its MTP layers."""
        return self.weights_bytes - self.mtp_bytes

    def layer_bytes_per_token(self, kv_dtype_bytes: int, tensor_parallel: int = 1) -> int:
        """K and V of one layer for one token, on one device (KV heads split over tensor parallel,
        replicated below one per device; MLA's one latent vector on every device)."""
        if self.latent_dim:
            return self.latent_dim * kv_dtype_bytes + self.indexer_bytes
        heads = max(1, self.kv_heads // tensor_parallel)
        return 2 * heads * self.head_dim * kv_dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tensor_parallel: int = 1) -> int:
        """Every layer, as for a sequence shorter than the sliding window (what vLLM holds per token is
        plan/kv.py's: it knows blocks, sliding windows and the tokens in flight)."""
        return self.layers * self.layer_bytes_per_token(kv_dtype_bytes, tensor_parallel)

    def extended_window(self, hf_overrides: dict[str, Any] | None) -> int:
        """The window the model supports under its rope scaling (YaRN via `hf_overrides`), else native."""
        scaling = None
        for source in (hf_overrides or {}, {"rope_scaling": self.rope_scaling}):
            scaling = source.get("rope_scaling") or source.get("rope_parameters") or scaling
            if scaling:
                break
        if not isinstance(scaling, dict):
            return self.native_window
        factor = scaling.get("factor")
        kind = scaling.get("rope_type") or scaling.get("type")
        if not factor or kind in (None, "default", "linear", "llama3"):
            # linear (Gemma 3) and llama3 scaling are already part of the native window.
            return self.native_window
        original = int(scaling.get("original_max_position_embeddings") or self.native_window)
        return max(self.native_window, int(original * float(factor)))


def dtype_bytes(dtype: str, facts: ModelFacts) -> int:
    """Bytes per element an engine computes in: `auto` is the checkpoint's dtype."""
    d = str(dtype or "auto").lower()
    return facts.stored_dtype_bytes if d == "auto" else DTYPE_BYTES.get(d, 2)
