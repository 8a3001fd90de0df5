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
    "float32": 4, "float": 4, "fp32": 4, "f32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2, "f16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "f8_e4m3": 1, "f8_e5m2": 1, "int8": 1, "i8": 1, "u8": 1,
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

    def layer_bytes_per_token(self, kv_dtype_bytes: int, tensor_parallel: int = 1) -> int:
        """K and V of one layer for one token, on one device (KV heads split over tensor parallel,
        replicated below one per device)."""
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
    "qwen3-8b": ModelFacts(layers=36, heads=32, kv_heads=8, head_dim=128, weights_bytes=16_381_470_720,
                           stored_dtype_bytes=2, native_window=40960),
    "qwen3-32b": ModelFacts(layers=64, heads=64, kv_heads=8, head_dim=128, weights_bytes=65_524_246_528,
                            stored_dtype_bytes=2, native_window=40960),
    "llama-3.1-8b-instruct": ModelFacts(layers=32, heads=32, kv_heads=8, head_dim=128, weights_bytes=16_060_522_496,
                                        stored_dtype_bytes=2, native_window=131072),
    # 48 layers, every 6th global; the others attend to the last 1024 tokens.
    # Weights: language model and vision tower, 12.19 B parameters (from the architecture).
    "gemma-3-12b-it": ModelFacts(layers=48, heads=16, kv_heads=8, head_dim=256, weights_bytes=24_374_650_080,
                                 stored_dtype_bytes=2, native_window=131072, sliding_window=1024, sliding_layers=40),
    # 23.57 B parameters (from the architecture).
    "mistral-small-24b-instruct-2501": ModelFacts(layers=40, heads=32, kv_heads=8, head_dim=128,
                                                  weights_bytes=47_144_806_400, stored_dtype_bytes=2,
                                                  native_window=32768),
    "smollm2-135m-instruct": ModelFacts(layers=30, heads=9, kv_heads=3, head_dim=64, weights_bytes=269_030_016,
                                        stored_dtype_bytes=2, native_window=8192),
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
_MISTRAL_KEYS = {"n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
                 "dim": "hidden_size", "max_seq_len": "max_position_embeddings"}


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
    return ModelFacts(layers=layers, heads=int(heads or kv_heads), kv_heads=int(kv_heads), head_dim=int(head_dim),
                      weights_bytes=weights,
                      stored_dtype_bytes=stored, native_window=window, sliding_window=sliding_window,
                      sliding_layers=sliding_layers, rope_scaling=scaling if isinstance(scaling, dict) else None,
                      source=f"read from {path}", on_disk=True)


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
            facts = replace(facts, weights_bytes=known.weights_bytes, stored_dtype_bytes=known.stored_dtype_bytes,
                            source=f"{facts.source}; weights size from built-in facts (no *.safetensors there)")
        return facts
    if known:
        return replace(known, source=f"from built-in facts; weights not found at {where}")
    return None


def dtype_bytes(dtype: str, facts: ModelFacts) -> int:
    """Bytes per element an engine computes in: `auto` is the checkpoint's dtype."""
    d = str(dtype or "auto").lower()
    return facts.stored_dtype_bytes if d == "auto" else DTYPE_BYTES.get(d, 2)
