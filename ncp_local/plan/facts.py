"""What the plan needs to know about a model: its weights and its KV cache per token.

Read from the model directory when it is on disk (`config.json`, the
safetensors index or the safetensors headers: no weights are loaded), else
from a small table of the models in `conf/model/`, so that a plan can be
made on a machine without the weights (a laptop, a login node, CI).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..engines.embedded import embedded_model_dir

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


# ---- reading a model directory ------------------------------------------------


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 * 2**20:
            raise ValueError(f"{path}: implausible safetensors header length {n}")
        return json.loads(f.read(n))


def weights_from_headers(files: list[Path]) -> tuple[int, int]:
    """(total tensor bytes, bytes per element of the dtype holding most of them)."""
    total = 0
    by_dtype: dict[str, int] = {}
    for f in files:
        for name, t in safetensors_header(f).items():
            if name == "__metadata__":
                continue
            start, end = t["data_offsets"]
            total += end - start
            by_dtype[t["dtype"].lower()] = by_dtype.get(t["dtype"].lower(), 0) + end - start
    main = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else "bf16"
    return total, DTYPE_BYTES.get(main, 2)


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    # Multimodal checkpoints (Gemma 3) keep the language model's shape in text_config.
    text = cfg.get("text_config")
    if isinstance(text, dict):
        return {**{k: v for k, v in cfg.items() if k != "text_config"}, **text}
    return cfg


def _sliding(cfg: dict[str, Any], layers: int) -> tuple[int | None, int]:
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        n = sum(1 for t in types if "sliding" in str(t))
        return (int(window) if window and n else None), n
    if not window or cfg.get("use_sliding_window") is False:
        return None, 0
    model_type = str(cfg.get("model_type", ""))
    pattern = cfg.get("sliding_window_pattern")
    if pattern is None and model_type.startswith("gemma3"):
        pattern = 6  # Gemma 3: five local layers, then one global
    if pattern:
        pattern = int(pattern)
        return int(window), sum(1 for i in range(layers) if (i + 1) % pattern != 0)
    if model_type.startswith(("qwen2", "qwen3")):
        # Qwen's max_window_layers: layers from that index on use the window.
        first = int(cfg.get("max_window_layers", layers))
        return int(window), max(0, layers - first)
    return int(window), layers  # Mistral-7B style: every layer slides


# Mistral's own format (params.json) names the same shape differently.
_MISTRAL_KEYS = {
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "dim": "hidden_size",
    "max_seq_len": "max_position_embeddings",
}


def read_model_dir(path: Path) -> ModelFacts:
    """Facts from config.json (or Mistral's params.json) and the safetensors index or headers;
    raises ValueError naming the file."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file() and (path / "params.json").is_file():
        cfg_file = path / "params.json"
    try:
        cfg = _text_config(json.loads(cfg_file.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{cfg_file}: {exc}") from None
    if cfg_file.name == "params.json":
        cfg = {_MISTRAL_KEYS.get(k, k): v for k, v in cfg.items()}
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"]) if "num_attention_heads" in cfg else None
        kv_heads = int(cfg.get("num_key_value_heads") or heads or 0)
        head_dim = cfg.get("head_dim")
        if not head_dim:
            model_type = str(cfg.get("model_type", ""))
            # Gemma 3's head_dim (256) is not hidden_size / heads, and its configs may leave it out.
            head_dim = 256 if model_type.startswith("gemma3") else int(cfg["hidden_size"]) // int(heads or 1)
        window = int(cfg.get("max_position_embeddings") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{cfg_file}: cannot read the model's shape ({type(exc).__name__}: {exc})") from None
    stored = DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower(), 2)
    index = path / "model.safetensors.index.json"
    weights = 0
    if index.is_file():
        try:
            weights = int(json.loads(index.read_text(encoding="utf-8"))["metadata"]["total_size"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{index}: no metadata.total_size ({type(exc).__name__}: {exc})") from None
    else:
        # A repository with both formats (Mistral's) holds the weights twice: count one copy.
        files = sorted(path.glob("model*.safetensors")) or sorted(path.glob("*.safetensors"))
        if files:
            weights, stored = weights_from_headers(files)
    sliding_window, sliding_layers = _sliding(cfg, layers)
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    shape = _moe_mla(cfg, layers, weights, stored)
    if shape["latent_dim"]:
        kv_heads, head_dim = 1, shape["latent_dim"]  # one latent "head" a layer (vLLM: num_kv_heads=1)
    return ModelFacts(
        layers=layers,
        heads=int(heads or kv_heads),
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        weights_bytes=weights,
        stored_dtype_bytes=stored,
        native_window=window,
        sliding_window=sliding_window,
        sliding_layers=sliding_layers,
        rope_scaling=scaling if isinstance(scaling, dict) else None,
        source=f"read from {path}",
        on_disk=True,
        **shape,
    )


# DeepSeek-V3.2's indexer keeps its keys in fp8 with one float32 scale per this many values
# (0.33 deepseek_v2.py `Indexer.quant_block_size`).
INDEXER_QUANT_BLOCK = 128


def _moe_mla(cfg: dict[str, Any], layers: int, weights: int, stored: int) -> dict[str, Any]:
    """What config.json says about MLA, the indexer, experts, MTP layers and the checkpoint's quantization."""
    latent = 0
    if cfg.get("kv_lora_rank"):
        latent = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
    indexer = 0
    if cfg.get("index_topk") and cfg.get("index_head_dim"):
        d = int(cfg["index_head_dim"])
        indexer = d + d // INDEXER_QUANT_BLOCK * 4
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    active = int(cfg.get("num_experts_per_tok") or 0) if experts else 0
    quant = cfg.get("quantization_config")
    method = str(quant.get("quant_method") or "quantized") if isinstance(quant, dict) else None
    mtp = int(cfg.get("num_nextn_predict_layers") or 0)
    block = quant.get("weight_block_size") if isinstance(quant, dict) else None
    moe_layers = max(1, layers - int(cfg.get("first_k_dense_replace") or 0)) if experts else layers
    params = 0 if method else weights // max(stored, 1)
    return dict(
        latent_dim=latent,
        indexer_bytes=indexer,
        experts=experts,
        active_experts=active,
        params=params,
        active_params=_active_params(cfg, params, experts, active, moe_layers) if params else 0,
        mtp_layers=mtp,
        mtp_bytes=_mtp_bytes(weights, mtp, moe_layers),
        quantization=method,
        moe_intermediate=int(cfg.get("moe_intermediate_size") or 0) if experts else 0,
        weight_block=int(block[0]) if isinstance(block, list) and block else 0,
        expert_bytes=_expert_bytes(cfg, experts, moe_layers, method, stored, weights),
    )


# Bytes a parameter of a quantized checkpoint's experts: FP8 one; other methods (INT4 compressed-tensors,
# AWQ, GPTQ) four bits with a 16-bit scale per group of 32, unless the config says its bits.
_FP8_BYTES = 1.0
_INT4_BYTES = 0.5 + 2 / 32


def _expert_bytes(
    cfg: dict[str, Any], experts: int, moe_layers: int, method: str | None, stored: int, weights: int
) -> int:
    """The routed experts' bytes: their shapes at the checkpoint's bytes a parameter (an estimate for
    quantized checkpoints), never more than the checkpoint."""
    if not experts:
        return 0
    params = moe_layers * experts * 3 * int(cfg.get("hidden_size") or 0) * int(cfg.get("moe_intermediate_size") or 0)
    per = float(stored) if not method else (_FP8_BYTES if "fp8" in method else _INT4_BYTES)
    return min(weights, int(params * per))


def _mtp_bytes(weights: int, mtp: int, moe_layers: int) -> int:
    """An MTP layer is one more MoE decoder layer (plus a small projection): its share of the checkpoint,
    counted as one MoE layer's. An estimate on the low side, so the plan counts the loaded weights high."""
    return weights * mtp // (moe_layers + mtp) if mtp else 0


def _active_params(cfg: dict[str, Any], params: int, experts: int, active: int, moe_layers: int) -> int:
    """Parameters one token uses: all, less the routed experts it does not use (3 matrices of
    hidden x moe_intermediate_size each)."""
    if not experts or not active:
        return params
    hidden = int(cfg.get("hidden_size") or 0)
    inter = int(cfg.get("moe_intermediate_size") or 0)
    routed = moe_layers * experts * 3 * hidden * inter
    return max(0, params - routed * (experts - active) // experts)


def model_dir(path: str) -> Path:
    """Where a model record's weights live, without converting or downloading anything."""
    if path == "embedded":
        return embedded_model_dir()
    return Path(path).expanduser()


def model_facts(name: str, path: str) -> ModelFacts | None:
    """The real files when present, else the built-in table (which the plan says); None when neither."""
    where = model_dir(path)
    known = built_in(name, path)
    if (where / "config.json").is_file() or (where / "params.json").is_file():
        facts = read_model_dir(where)
        if not facts.native_window and known:
            facts = replace(facts, native_window=known.native_window)
        if not facts.weights_bytes and known:
            # A directory with the config but without the weights (yet): the table's size.
            facts = replace(
                facts,
                weights_bytes=known.weights_bytes,
                stored_dtype_bytes=known.stored_dtype_bytes,
                source=f"{facts.source}; weights size from built-in facts (no *.safetensors there)",
            )
        return facts
    if known:
        return replace(known, source=f"from built-in facts; weights not found at {where}")
    return None


def dtype_bytes(dtype: str, facts: ModelFacts) -> int:
    """Bytes per element an engine computes in: `auto` is the checkpoint's dtype."""
    d = str(dtype or "auto").lower()
    return facts.stored_dtype_bytes if d == "auto" else DTYPE_BYTES.get(d, 2)
