"""One engine's KV cache on one device, sized by vLLM's own rules (0.33; read from its source).

vLLM refuses to start unless its KV cache holds one request of `max_model_len`
tokens ("To serve at least one request with the model's max seq len ...":
0.33 `vllm/v1/core/kv_cache_planning.py`, `get_kv_cache_configs` ->
`_check_enough_kv_cache_memory`), and it counts that request layer by layer,
with each layer's KV spec (`vllm/v1/kv_cache_interface.py`):

- full attention, `FullAttentionSpec.max_memory_usage_bytes`: every token of
  `max_model_len`, in blocks of `block_size` tokens;
- sliding window, `SlidingWindowSpec.max_admission_blocks_per_request`:
  `min(sliding_window - 1 + tokens in flight, max_model_len)` tokens, plus one
  block (the window need not start on a block boundary). Blocks that leave the
  window are freed only once the steps that scheduled them settle, so the
  tokens in flight are `max_num_batched_tokens` x the steps in flight
  (`VllmConfig.max_in_flight_tokens` = `max_concurrent_batches` x
  `max_num_batched_tokens`; 2 steps with async scheduling, on by default).

Where the installed vLLM imports (the CPU build here, 0.33 on a GPU node),
the plan builds those spec objects and asks them; otherwise it uses the same
formulas, written out below with the 0.33 function each one follows. Either
way the plan says which (`rules`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..engines.settings import GPU_STEP_TOKENS

# 0.33 `vllm/config/cache.py` `CacheConfig.DEFAULT_BLOCK_SIZE`. FlashAttention (Ampere, Hopper) keeps it;
# a backend may prefer another (`Platform.update_block_size_for_backend`), which only moves the
# rounding here by a block per layer group; `engine_args.block_size` pins it.
DEFAULT_BLOCK_SIZE = 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def step_tokens(engine_args: dict[str, Any], max_model_len: int, max_num_seqs: int, on_gpu: bool) -> int:
    """`max_num_batched_tokens` as the rig starts the engine (engines/vllm_args.py `engine_kwargs`):
    on a GPU the user's or 16384; on the CPU build at least a whole prompt beside a step of decodes."""
    given = int(engine_args.get("max_num_batched_tokens") or 0)
    if on_gpu:
        return given or GPU_STEP_TOKENS
    return max(given, max_model_len + max_num_seqs)


def steps_in_flight(engine_args: dict[str, Any]) -> int:
    """0.33 `vllm/config/vllm.py` `VllmConfig.max_concurrent_batches`: with async scheduling (on unless
    `async_scheduling: false`) the model runner V2 (0.33's default) keeps pipeline_parallel_size + 1
    steps in flight, the V1 runner 2 at pipeline_parallel_size 1; without it, one per pipeline stage."""
    pp = int(engine_args.get("pipeline_parallel_size") or 1)
    if engine_args.get("async_scheduling") is False:
        return pp
    return pp + 1


def kv_heads_per_device(kv_heads: int, tensor_parallel: int) -> int:
    """0.33 `vllm/config/model.py` `ModelConfig.get_num_kv_heads`: KV heads split over tensor parallel,
    replicated (one per GPU) when tensor parallel exceeds them."""
    return max(1, kv_heads // tensor_parallel)


@dataclass(frozen=True)
class KvSizing:
    """The KV cache layout of one engine on one of its devices, as vLLM will lay it out."""

    full_layers: int
    sliding_layers: int  # 0 when the model has none or the hybrid KV cache manager is off
    sliding_window: int | None
    kv_heads: int  # per device, after tensor parallel
    head_dim: int
    dtype_bytes: int  # per element of K and V (`kv_cache_dtype`, or the model's dtype for `auto`)
    block_size: int
    max_model_len: int
    step_tokens: int  # max_num_batched_tokens
    steps_in_flight: int
    use_vllm: bool = True  # ask the installed vLLM's spec objects (else the formulas below)
    # MLA (0.33 `MLAAttention.get_kv_cache_spec`): one latent vector of `latent_dim` elements per layer and
    # token (num_kv_heads=1, max_tp_shards=1: every tensor-parallel rank holds it whole, no V).
    latent_dim: int = 0
    # A packed per-token layout in place of latent_dim x dtype_bytes: `fp8_ds_mla` 656 bytes (512 fp8
    # values, 4 float32 scales, 64 bf16 RoPE values), `nvfp4_ds_mla` 352 (`state_content_bytes` there).
    state_bytes: int | None = None
    # DeepSeek-V3.2's indexer cache beside each MLA layer (`DeepseekV32IndexerCache`: uint8, one head).
    indexer_bytes: int = 0

    @property
    def layers(self) -> int:
        return self.full_layers + self.sliding_layers

    @property
    def in_flight_tokens(self) -> int:
        """0.33 `VllmConfig.max_in_flight_tokens`."""
        return self.steps_in_flight * self.step_tokens

    @property
    def sliding_tokens(self) -> int:
        """Tokens one request holds on a sliding-window layer at most (before block rounding)."""
        if not self.sliding_layers or not self.sliding_window:
            return 0
        return min(self.sliding_window - 1 + self.in_flight_tokens, self.max_model_len)

    @property
    def rules(self) -> str:
        """Whose numbers these are: the installed vLLM's spec objects, or the formulas below."""
        return self._counts[3]

    def token_bytes(self) -> int:
        """One layer's cache for one token on one device: K and V of its KV heads, or MLA's latent vector
        (and the indexer's keys beside it)."""
        if self.latent_dim:
            return (self.state_bytes or self.latent_dim * self.dtype_bytes) + self.indexer_bytes
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def bytes_per_token(self) -> int:
        """Every layer's cache of one token, as for a request shorter than the sliding window."""
        return self.layers * self.token_bytes()

    # ---- vLLM's numbers (computed once per layout: the plan asks them often) -----------------

    @functools.cached_property
    def _counts(self) -> tuple[int, int, int, str]:
        return _block_counts(self)

    @functools.cached_property
    def _groups(self) -> tuple[int, int, int]:
        full, slide = self.full_layers, self.sliding_layers
        if not full or not slide:
            return full + slide, int(full > 0), int(slide > 0)
        size = min(full, slide)
        if max(full, slide) < 1.5 * size:
            size = max(full, slide)
        return size, cdiv(full, size), cdiv(slide, size)

    def page_bytes(self) -> int:
        """One block of one layer (`AttentionSpec.page_size_bytes`)."""
        return self._counts[0]

    def groups(self) -> tuple[int, int, int]:
        """(layers per group, full-attention groups, sliding-window groups).

        0.33 `kv_cache_planning.py`: one group when every layer has the same spec
        (`_get_kv_cache_groups_uniform_spec`); else `_get_kv_cache_groups_uniform_page_size`:
        groups of the smaller type's layer count (the larger's when it is under 1.5 times the
        smaller), the last group of a type padded with empty layers, so padding costs memory too."""
        return self._groups

    def block_bytes(self) -> int:
        """One block of the shared pool: a page for each layer of a group (`_get_kv_cache_bytes_per_block`).
        vLLM keeps one such block back (the null block) before it checks or counts capacity."""
        return self._groups[0] * self._counts[0]

    @functools.cached_property
    def _request_blocks(self) -> int:
        _, full_blocks, sliding_blocks, _ = self._counts
        _, full_groups, sliding_groups = self._groups
        return full_groups * full_blocks + sliding_groups * sliding_blocks

    def request_blocks(self) -> int:
        """Pool blocks one `max_model_len` request takes: the sum over groups
        (`_max_memory_usage_bytes_from_groups`)."""
        return self._request_blocks

    def request_bytes(self) -> int:
        """The KV cache one `max_model_len` request needs: the figure of vLLM's start-up check."""
        return self._request_blocks * self.block_bytes()

    def startup_bytes(self) -> int:
        """The KV budget vLLM must find to start: one `max_model_len` request and the null block."""
        return (self._request_blocks + 1) * self.block_bytes()

    def held_bytes(self, tokens: int) -> int:
        """What a request of `tokens` (at most `max_model_len`) holds: every token on full layers,
        on sliding layers no more than the admission cap (`apply_admission_cap` in
        `SingleTypeKVCacheManager.get_num_blocks_to_allocate`)."""
        tokens = max(0, min(tokens, self.max_model_len))
        _, _, cap, _ = self._counts
        _, full_groups, sliding_groups = self._groups
        blocks = cdiv(tokens, self.block_size)
        return (full_groups * blocks + sliding_groups * min(blocks, cap)) * self.block_bytes()

    def max_concurrency(self, kv_bytes: int) -> float:
        """`max_model_len` requests the cache holds at once: vLLM's "Maximum concurrency" log figure
        (0.33 `kv_cache_utils.py` `get_max_concurrency_for_kv_cache_config`)."""
        if not self.request_blocks():
            return 0.0
        return (kv_bytes // self.block_bytes()) / self.request_blocks()

    def capacity_tokens(self, kv_bytes: int) -> int:
        """vLLM's "KV cache size: N tokens" log figure (`get_kv_cache_capacity`)."""
        return int(self.max_concurrency(kv_bytes) * self.max_model_len)


# ---- the two ways to the same counts -------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _block_counts(s: KvSizing) -> tuple[int, int, int, str]:
    """(page bytes, blocks of a full-attention layer, blocks of a sliding layer) for one
    `max_model_len` request, and whose rules gave them: the installed vLLM's spec objects where
    vLLM imports, else the formulas."""
    vllm = _vllm() if s.use_vllm else None
    if vllm is not None:
        try:
            return (*_counts_vllm(s, vllm), f"vLLM {vllm.version}'s own KV specs")
        except (TypeError, AttributeError, ValueError, AssertionError):  # another vLLM's specs: the formulas
            pass
    return (*_counts_formula(s), "vLLM 0.33's KV rules, reproduced (vLLM does not import here)")


def _counts_formula(s: KvSizing) -> tuple[int, int, int]:
    # 0.33 AttentionSpec.page_size_bytes: block_size x KV heads x (K + V head size) x dtype size; MLA:
    # block_size x (latent x dtype size, or the packed state), and the indexer's page, a layer of the
    # same group (its pages add up: `UniformTypeKVCacheSpecs.page_size_bytes`).
    page = s.block_size * s.token_bytes()
    # 0.33 FullAttentionSpec.max_memory_usage_bytes: cdiv(max_model_len, block_size) pages.
    full = cdiv(s.max_model_len, s.block_size)
    # 0.33 SlidingWindowSpec.max_admission_blocks_per_request:
    # cdiv(min(sliding_window - 1 + max_in_flight_tokens, max_model_len), block_size) + 1.
    sliding = cdiv(s.sliding_tokens, s.block_size) + 1 if s.sliding_layers else 0
    return page, full, sliding


@dataclass(frozen=True)
class _Vllm:
    version: str
    full: Any  # FullAttentionSpec
    sliding: Any  # SlidingWindowSpec
    torch: Any
    mla: Any = None  # MLAAttentionSpec
    indexer_role: Any = None  # SparseCacheRole.INDEXER


@functools.cache
def _vllm() -> _Vllm | None:
    """vLLM's KV spec classes, when vLLM imports here (no GPU needed); None otherwise."""
    try:
        import torch
        import vllm
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    except Exception:  # not installed, or a broken install: the formulas give the same numbers
        return None
    try:
        from vllm.v1.kv_cache_interface import MLAAttentionSpec, SparseCacheRole
    except ImportError:  # a vLLM without them: MLA by the formulas
        MLAAttentionSpec = SparseCacheRole = None
    return _Vllm(
        str(getattr(vllm, "__version__", "?")),
        FullAttentionSpec,
        SlidingWindowSpec,
        torch,
        MLAAttentionSpec,
        getattr(SparseCacheRole, "INDEXER", None),
    )


def _torch_dtype(torch: Any, nbytes: int) -> Any:
    # vLLM sizes pages with get_dtype_size(dtype) only; fp8 caches are torch.uint8 in its table.
    return {4: torch.float32, 2: torch.bfloat16, 1: torch.uint8}.get(nbytes, torch.bfloat16)


def _counts_vllm(s: KvSizing, v: _Vllm) -> tuple[int, int, int]:
    dtype = _torch_dtype(v.torch, s.dtype_bytes)
    # Only what these methods read of a VllmConfig (no model, no GPU): the window, decode context
    # parallel (off), and the tokens in flight.
    config = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=s.max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        max_in_flight_tokens=s.in_flight_tokens,
    )
    if s.latent_dim:
        return _counts_vllm_mla(s, v, config)
    full = v.full(block_size=s.block_size, num_kv_heads=s.kv_heads, head_size=s.head_dim, dtype=dtype)
    page = int(full.page_size_bytes)
    full_blocks = cdiv(int(full.max_memory_usage_bytes(config)), page)
    sliding_blocks = 0
    if s.sliding_layers and s.sliding_window:
        sliding = v.sliding(
            block_size=s.block_size,
            num_kv_heads=s.kv_heads,
            head_size=s.head_dim,
            dtype=dtype,
            sliding_window=s.sliding_window,
        )
        sliding_blocks = cdiv(int(sliding.max_memory_usage_bytes(config)), int(sliding.page_size_bytes))
    return page, full_blocks, sliding_blocks


def _counts_vllm_mla(s: KvSizing, v: _Vllm, config: Any) -> tuple[int, int, int]:
    """MLA layers (and V3.2's indexer) as their layers describe them to vLLM (0.33
    `MLAAttention.get_kv_cache_spec`, `DeepseekV32IndexerCache.get_kv_cache_spec`)."""
    if v.mla is None:
        raise TypeError("this vLLM has no MLAAttentionSpec")
    latent = v.mla(
        block_size=s.block_size,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=s.latent_dim,
        dtype=_torch_dtype(v.torch, s.dtype_bytes),
        state_content_bytes=s.state_bytes,
    )
    page = int(latent.page_size_bytes)
    blocks = cdiv(int(latent.max_memory_usage_bytes(config)), page)
    if s.indexer_bytes:
        if v.indexer_role is None:
            raise TypeError("this vLLM has no indexer cache role")
        indexer = v.mla(
            block_size=s.block_size,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=s.indexer_bytes,
            dtype=v.torch.uint8,
            cache_role=v.indexer_role,
        )
        page += int(indexer.page_size_bytes)
    return page, blocks, 0


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def describe(s: KvSizing, per: str = "per GPU") -> str:
    """What one request holds, in the plan's words."""
    text = (
        f"one {s.max_model_len}-token request needs {gib(s.request_bytes())} of KV cache {per} "
        f"({s.rules}, {s.block_size}-token blocks"
    )
    if s.sliding_layers:
        text += (
            f"; each of the {s.sliding_layers} sliding-window layers holds min({s.sliding_window} - 1 + "
            f"{s.in_flight_tokens} tokens in flight, {s.max_model_len}) = {s.sliding_tokens} tokens, "
            f"the tokens in flight being {s.steps_in_flight} steps x max_num_batched_tokens={s.step_tokens}"
        )
    size, full_groups, sliding_groups = s.groups()
    padded = size * (full_groups + sliding_groups) - s.layers
    if padded:
        text += f"; {padded} empty layer(s) pad its layer groups, as vLLM pads them"
    return text + ")"
