"""A model's facts read from its directory when it is on disk (`config.json` or Mistral's `params.json`,
the safetensors index or the safetensors headers: no weights are loaded), else taken from the built-in
table (`known_models.py`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..engines.embedded import embedded_model_dir
from .facts import DTYPE_BYTES, ModelFacts
from .known_models import built_in


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
