"""mode=plan: model facts, GPU inventory, devices and shares, prompt growth, and the checks mode=run makes first."""

from __future__ import annotations

import itertools
import json
import os
import re
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from cli_runner import CliResult, run_cli
from documented_commands import every_command
from ncp_local import config as config_mod
from ncp_local import plan as plan_mod
from ncp_local.bindings import bind  # noqa: E402
from ncp_local.config import ConfigError
from ncp_local.modes.plan import full as plan_full
from ncp_local.plan.checkpoint import model_facts, read_model_dir
from ncp_local.plan.growth import Line, fit_line
from ncp_local.plan.hardware import GIB, inventory, parse_gpu, parse_gpus
from ncp_local.plan.known_models import BUILT_IN
from ncp_local.plan.kv import (
    GPU_STEP_TOKENS,
    KvSizing,
    kv_heads_per_device,
    steps_in_flight,
)
from ncp_local.plan.memory import CPU_RUNTIME_BYTES, engines_of
from ncp_local.protocol import ROLES

ROOT = Path(__file__).resolve().parent.parent
TWO = ["H100-80GB", "H100-80GB"]
ONE = ["H100-80GB"]


def cfg_for(overrides: list[str]) -> Any:
    raw = OmegaConf.to_container(config_mod.compose(overrides), resolve=True)
    return config_mod.validate(raw)  # type: ignore[arg-type]


def planned(cfg: Any) -> Any:
    """The config with every GPU model's share left to the plan (`gpu_memory_utilization: null`)."""
    upd = {}
    for role in ("narrator", "player", "auditor"):
        rc = getattr(cfg, role)
        if rc.model.path != "embedded":
            upd[role] = rc.model_copy(update={"model": rc.model.model_copy(update={"gpu_memory_utilization": None})})
    return cfg.model_copy(update=upd)


QWEN3 = {"Qwen3-8B": (36, 4096, 32, 16_381_470_720), "Qwen3-32B": (64, 5120, 64, 65_524_246_528)}


@pytest.fixture()
def models_root(tmp_path: Path) -> Path:
    """Qwen3-8B and -32B as their config.json and safetensors index say (no weights): what mode=run sees."""
    root = tmp_path / "models"
    for name, (layers, hidden, heads, total) in QWEN3.items():
        d = root / "Qwen" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(
            json.dumps(
                {
                    "model_type": "qwen3",
                    "num_hidden_layers": layers,
                    "hidden_size": hidden,
                    "num_attention_heads": heads,
                    "num_key_value_heads": 8,
                    "head_dim": 128,
                    "max_position_embeddings": 40960,
                    "torch_dtype": "bfloat16",
                    "use_sliding_window": False,
                    "sliding_window": None,
                    "max_window_layers": layers,
                }
            )
        )
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": {}})
        )
    return root


def _run(*args: str, cwd: Path) -> CliResult:
    return run_cli(*args, cwd=cwd)


# ---- model facts ---------------------------------------------------------------------


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A real safetensors file: header JSON, then zero bytes for each tensor (name -> dtype, shape, bytes)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_reads_config_and_index_total_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "hidden_size": 512,
                "max_position_embeddings": 16384,
                "torch_dtype": "bfloat16",
            }
        )
    )
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 123456789}, "weight_map": {}})
    )
    f = read_model_dir(tmp_path)
    assert (f.layers, f.kv_heads, f.head_dim, f.native_window) == (4, 2, 64, 16384)  # head_dim = 512 / 8
    assert f.weights_bytes == 123456789 and f.stored_dtype_bytes == 2
    assert f.kv_bytes_per_token(2) == 4 * 2 * 2 * 64 * 2  # layers x K,V x heads x head dim x bytes
    assert f.kv_bytes_per_token(2, tensor_parallel=2) == f.kv_bytes_per_token(2) // 2


def test_sums_safetensors_headers_without_index(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "head_dim": 32,
                "hidden_size": 64,
                "max_position_embeddings": 4096,
                "use_sliding_window": False,
                "sliding_window": 4096,
            }
        )
    )
    _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("F32", [10, 10], 400)})
    _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"b": ("F32", [5], 20), "c": ("BF16", [3], 6)})
    f = read_model_dir(tmp_path)
    assert f.weights_bytes == 426 and f.stored_dtype_bytes == 4  # most bytes are F32
    assert f.sliding_layers == 0 and f.sliding_window is None  # use_sliding_window: false
    assert f.head_dim == 32


def test_reads_mistral_params_json_and_one_copy_of_the_weights(tmp_path: Path) -> None:
    # Mistral's repository: its own params.json and consolidated file beside the HF shards (the same weights).
    (tmp_path / "params.json").write_text(
        json.dumps({"dim": 5120, "n_layers": 40, "head_dim": 128, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 131072})
    )
    _write_safetensors(tmp_path / "consolidated.safetensors", {"w": ("BF16", [100], 200)})
    _write_safetensors(tmp_path / "model-00001-of-00001.safetensors", {"w": ("BF16", [100], 200)})
    f = model_facts("mistral-small-24b-instruct-2501", str(tmp_path))
    assert f is not None and (f.layers, f.kv_heads, f.head_dim) == (40, 8, 128)
    assert f.weights_bytes == 200 and f.on_disk
    assert f.native_window == 32768  # not in params.json: the built-in table's


def test_gemma3_sliding_layers_are_capped_at_their_window(tmp_path: Path) -> None:
    # Gemma 3's config nests the language model and may leave head_dim out (it is 256, not hidden / heads).
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gemma3",
                "text_config": {
                    "model_type": "gemma3_text",
                    "num_hidden_layers": 48,
                    "num_attention_heads": 16,
                    "num_key_value_heads": 8,
                    "hidden_size": 3840,
                    "sliding_window": 1024,
                    "max_position_embeddings": 131072,
                },
            }
        )
    )
    f = read_model_dir(tmp_path)
    assert (f.head_dim, f.sliding_window, f.sliding_layers) == (256, 1024, 40)  # every 6th layer is global
    # As vLLM holds it (plan/kv.py): 16-token blocks; the 8 global layers keep every token, the 40 sliding
    # ones at most their window - 1 plus the tokens in flight (2 steps of 16384) and one block.
    kv = KvSizing(
        full_layers=8,
        sliding_layers=40,
        sliding_window=1024,
        kv_heads=8,
        head_dim=256,
        dtype_bytes=2,
        block_size=16,
        max_model_len=131072,
        step_tokens=16384,
        steps_in_flight=2,
    )
    page = 16 * 2 * 8 * 256 * 2  # one block of one layer
    assert kv.held_bytes(50_000) == page * (8 * 3125 + 40 * (-(-(1023 + 32768) // 16) + 1))
    assert kv.held_bytes(500) == page * 48 * 32  # shorter than the window: every layer holds it all
    # An explicit layer_types list wins over the pattern.
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gemma3_text",
                "num_hidden_layers": 4,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 8,
                "hidden_size": 16,
                "sliding_window": 16,
                "max_position_embeddings": 64,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            }
        )
    )
    assert read_model_dir(tmp_path).sliding_layers == 2


def test_absent_model_uses_built_in_facts_and_says_so(tmp_path: Path) -> None:
    where = tmp_path / "Qwen" / "Qwen3-8B"
    f = model_facts("qwen3-8b", str(where))
    assert f is not None and f.layers == BUILT_IN["qwen3-8b"].layers
    assert f.source == f"from built-in facts; weights not found at {where}"
    # Found by the directory name when the record's name is not in the table.
    assert model_facts("my-qwen", str(where)) == f
    assert model_facts("unknown-model", str(tmp_path / "nothing")) is None


def test_every_model_file_has_facts_and_a_window_it_can_run() -> None:
    for path in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        model = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        assert isinstance(model, dict)
        where = "embedded" if model["path"] == "embedded" else str(model["path"]).replace("${models_root}", "/none")
        facts = model_facts(str(model["name"]), where)
        assert facts is not None, path.name
        hf = (model.get("engine_args") or {}).get("hf_overrides")
        assert int(model["max_model_len"]) <= facts.extended_window(hf), path.name


def test_yarn_override_extends_the_window() -> None:
    f = BUILT_IN["qwen3-8b"]
    yarn = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    assert f.extended_window(None) == 40960
    assert f.extended_window(yarn) == 131072


# ---- KV sizing by vLLM's own rules --------------------------------------------------------------------

# Gemma-3-12B on one GPU at the rig's 16384-token step budget (vLLM 0.33's rules, written out): 16-token
# blocks of 16 x 8 KV heads x (256 + 256) x 2 bytes = 128 KiB per layer; 8 global layers hold all
# 131072 tokens (8192 blocks), 40 sliding layers min(1024 - 1 + 2 x 16384, 131072) = 33791 tokens
# (2112 blocks + 1); vLLM groups them 8 layers a group (1 full, 5 sliding), so one request takes
# (8192 + 5 x 2113) blocks of 8 pages = 19,668,140,032 bytes (18.3 GiB). The old plan's 8.3 GiB counted
# 1024 tokens per sliding layer.
GEMMA3_12B_REQUEST = (8192 + 5 * 2113) * 8 * 16 * 8 * 512 * 2


def _gemma_engine(gpus: str = "[H100-80GB]", *extra: str) -> Any:
    p = plan_mod.check(
        planned(cfg_for(["narrator=qwen3", "player=qwen3", "auditor=gemma3_12b", f"plan.gpus={gpus}", *extra]))
    )
    return p, next(e for e in p.engines if e.name == "gemma-3-12b-it")


def _vllm_layer_specs(kv: KvSizing) -> dict[str, Any]:
    """Gemma 3's 48 layers as vLLM's own spec objects (every 6th global), as its attention layers make them."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    common = dict(block_size=kv.block_size, num_kv_heads=kv.kv_heads, head_size=kv.head_dim, dtype=torch.bfloat16)
    return {
        f"model.layers.{i}.self_attn": (
            FullAttentionSpec(**common)
            if (i + 1) % 6 == 0
            else SlidingWindowSpec(**common, sliding_window=kv.sliding_window)
        )
        for i in range(kv.layers)
    }


def _vllm_config(kv: KvSizing) -> Any:
    """What vLLM's KV planning reads of a VllmConfig, for this layout (no model, no GPU)."""
    from types import SimpleNamespace as NS

    from vllm.v1.kv_cache_interface import KVCacheLayout

    return NS(
        model_config=NS(max_model_len=kv.max_model_len),
        parallel_config=NS(decode_context_parallel_size=1),
        max_in_flight_tokens=kv.in_flight_tokens,
        speculative_config=None,
        scheduler_config=NS(disable_hybrid_kv_cache_manager=False),
        attention_config=NS(hisparse_config=None),
        cache_config=NS(get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBHNC, num_gpu_blocks_override=None),
    )


def test_gemma3_12b_request_is_vllms_own_figure() -> None:
    p, e = _gemma_engine()
    kv = e.kv
    assert (kv.full_layers, kv.sliding_layers, kv.sliding_window, kv.step_tokens, kv.steps_in_flight) == (
        8,
        40,
        1024,
        16384,
        2,
    )
    assert kv.sliding_tokens == 33791 and kv.request_bytes() == GEMMA3_12B_REQUEST
    assert f"{kv.request_bytes() / GIB:.1f}" == "18.3"
    assert e.window_kv() == GEMMA3_12B_REQUEST + 8 * 16 * 8 * 512 * 2  # and the block vLLM holds back
    # The same through the formulas, without vLLM.
    assert replace(kv, use_vllm=False).request_bytes() == GEMMA3_12B_REQUEST
    # vLLM's own planning on its own spec objects: the grouping, the request's bytes, the start-up check.
    utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    if not hasattr(utils, "_max_memory_usage_bytes_from_groups"):
        pytest.skip("this vLLM plans the KV cache elsewhere (0.33: kv_cache_planning, with a builder)")
    specs, config = _vllm_layer_specs(kv), _vllm_config(kv)
    groups = utils.get_kv_cache_groups(config, dict(specs))
    assert sorted(len(g.layer_names) for g in groups) == [8] * 6 and kv.groups() == (8, 1, 5)
    assert utils._max_memory_usage_bytes_from_groups(config, groups) == GEMMA3_12B_REQUEST
    utils.check_enough_kv_cache_memory(config, specs, e.window_kv())
    with pytest.raises(ValueError, match="To serve at least one request"):
        utils.check_enough_kv_cache_memory(config, specs, e.window_kv() - 1)


def test_qwen3_and_gemma3_on_one_gpu_follow_from_that_figure() -> None:
    """The issue's command: on one H100-80GB the plan goes and each engine's KV cache holds one request;
    on one A100-40GB it refuses in one line naming the key to change (it used to end in a traceback)."""
    p, e = _gemma_engine()
    assert not p.fatal, [f.message for f in p.fatal]
    assert all(x.kv_bytes >= x.window_kv() for x in p.engines)
    assert sum(x.share for x in p.engines) <= 0.9 + 1e-9
    p, _ = _gemma_engine("[A100-40GB]")
    first = p.fatal[0]
    assert first.field == "auditor.model.tensor_parallel_size" and "\n" not in first.message
    assert "gemma-3-12b-it 44.0 GiB" in first.message and "auditor.model.tensor_parallel_size=2" in first.message


def test_mode_plan_on_one_a100_ends_in_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`mode=plan narrator=qwen3 player=qwen3 auditor=gemma3_12b plan.gpus=[A100-40GB]`: exit 2, one line."""
    from ncp_local.modes import plan as plan_mode

    cfg = cfg_for(["mode=plan", "narrator=qwen3", "player=qwen3", "auditor=gemma3_12b", "plan.gpus=[A100-40GB]"])
    assert plan_mode.main(cfg) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("error: config: auditor.model.tensor_parallel_size: plan: GPU 0 ")
    assert out.strip().splitlines()[-1].startswith("verdict: no-go: GPU 0 (A100, 40.0 GiB) cannot hold")


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_kv_formulas_are_vllms_specs(name: str) -> None:
    """The formulas the plan falls back to give what the installed vLLM's spec objects give."""
    pytest.importorskip("vllm.v1.kv_cache_interface")
    f = BUILT_IN[name]
    sliding = f.sliding_layers if f.sliding_window else 0
    for tp, nbytes, window, step, steps in itertools.product(
        (1, 2, 8, 16), (2, 1), (8192, 32768, 131072), (2048, 16384), (1, 2)
    ):
        kv = KvSizing(
            full_layers=f.layers - sliding,
            sliding_layers=sliding,
            sliding_window=f.sliding_window,
            kv_heads=kv_heads_per_device(f.kv_heads, tp),
            head_dim=f.head_dim,
            dtype_bytes=nbytes,
            block_size=16,
            max_model_len=window,
            step_tokens=step,
            steps_in_flight=steps,
        )
        formula = replace(kv, use_vllm=False)
        assert kv.rules.startswith("vLLM") and "reproduced" in formula.rules
        assert (kv.page_bytes(), kv.request_bytes(), kv.startup_bytes(), kv.held_bytes(5000)) == (
            formula.page_bytes(),
            formula.request_bytes(),
            formula.startup_bytes(),
            formula.held_bytes(5000),
        )


def test_tokens_in_flight_and_kv_heads_follow_vllms_config() -> None:
    """Steps in flight (`VllmConfig.max_concurrent_batches`, async scheduling on by default, model runner V2),
    tokens in flight, and KV heads per GPU (`ModelConfig.get_num_kv_heads`) as the installed vLLM computes them."""
    from types import SimpleNamespace as NS

    vllm_config = pytest.importorskip("vllm.config")
    for pp, async_scheduling in itertools.product((1, 2), (None, True, False)):
        ours = steps_in_flight({"pipeline_parallel_size": pp, "async_scheduling": async_scheduling})
        resolved = async_scheduling is not False  # vLLM turns it on when the user leaves it unset
        theirs = vllm_config.VllmConfig.max_concurrent_batches.fget(
            NS(
                parallel_config=NS(pipeline_parallel_size=pp),
                scheduler_config=NS(async_scheduling=resolved),
                use_v2_model_runner=True,
            )
        )
        assert ours == theirs, (pp, async_scheduling)
    assert (
        vllm_config.VllmConfig.max_in_flight_tokens.fget(
            NS(max_concurrent_batches=2, scheduler_config=NS(max_num_batched_tokens=GPU_STEP_TOKENS))
        )
        == 2 * GPU_STEP_TOKENS
    )
    for kv_heads, tp in itertools.product((1, 3, 8), (1, 2, 4, 8, 16)):
        theirs = vllm_config.ModelConfig.get_num_kv_heads(
            NS(use_mla=False, model_arch_config=NS(total_num_kv_heads=kv_heads)), NS(tensor_parallel_size=tp)
        )
        assert kv_heads_per_device(kv_heads, tp) == theirs


def test_the_kv_plan_follows_the_engine_settings() -> None:
    """kv_cache_dtype, tensor parallel past the KV heads, the step budget and async scheduling move the figure."""
    _, e = _gemma_engine()
    _, fp8 = _gemma_engine("[H100-80GB]", "+auditor.model.engine_args.kv_cache_dtype=fp8")
    assert fp8.kv.request_bytes() * 2 == e.kv.request_bytes()
    _, tp16 = _gemma_engine("[" + ",".join(["H100-80GB"] * 16) + "]", "auditor.model.tensor_parallel_size=16")
    assert tp16.kv.kv_heads == 1 and tp16.kv.request_bytes() * 8 == e.kv.request_bytes()  # 8 heads, replicated
    _, small = _gemma_engine(
        "[H100-80GB]",
        "+auditor.model.engine_args.max_num_batched_tokens=2048",
        "+auditor.model.engine_args.async_scheduling=false",
    )
    assert small.kv.sliding_tokens == 1023 + 2048
    _, whole = _gemma_engine("[H100-80GB]", "+auditor.model.engine_args.disable_hybrid_kv_cache_manager=true")
    assert whole.kv.sliding_layers == 0 and whole.kv.request_bytes() == 48 * 131072 * 8 * 512 * 2


def test_tensor_parallel_must_split_the_heads() -> None:
    cfg = cfg_for(
        [
            "narrator=qwen3",
            "player=qwen3",
            "auditor=qwen3",
            "plan.gpus=[H100-80GB,H100-80GB,H100-80GB]",
            "narrator.model.tensor_parallel_size=3",
            "player.model.tensor_parallel_size=3",
            "auditor.model.tensor_parallel_size=3",
        ]
    )
    first = plan_mod.check(cfg).fatal[0]
    assert first.field == "narrator.model.tensor_parallel_size" and "32 attention heads and 8 KV heads" in first.message


# ---- inventory ---------------------------------------------------------------------------


def test_gpu_override_parses_name_and_size() -> None:
    g = parse_gpu("H100-80GB")
    assert g.name == "H100" and g.total_bytes == 80 * GIB
    assert parse_gpu("A100_40GB").total_bytes == 40 * GIB
    with pytest.raises(ConfigError, match=r"plan\.gpus\[1\].*NAME-<N>GB"):
        inventory(["H100-80GB", "H100"])
    assert inventory([]).kind == "cpu"


def test_nvidia_smi_inventory_respects_cuda_visible_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho '0, GPU-aaa, NVIDIA H100 80GB HBM3, 81559, 3'\n"
        "echo '1, GPU-bbb, NVIDIA A100-SXM4-40GB, 40960, 2048'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inv = inventory(None)
    assert inv.kind == "gpu" and [g.total_bytes for g in inv.gpus] == [81559 * 2**20, 40960 * 2**20]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbb")  # Slurm may hand out UUIDs
    inv = inventory(None)
    assert [g.name for g in inv.gpus] == ["NVIDIA A100-SXM4-40GB"] and inv.gpus[0].used_bytes == 2048 * 2**20
    monkeypatch.setenv("PATH", "/nonexistent")
    assert inventory(None).kind == "cpu"


# ---- devices and shares ---------------------------------------------------------------------


def test_planned_shares_fit_two_gpus_and_hold_a_window_each() -> None:
    cfg = planned(cfg_for(["narrator=qwen3", "player=qwen3", "auditor=qwen3_32b", f"plan.gpus=[{','.join(TWO)}]"]))
    p = plan_mod.check(cfg)
    assert not p.fatal, p.fatal
    by_name = {e.name: e for e in p.engines}
    assert set(by_name) == {"qwen3-8b", "qwen3-32b"}  # narrator and player share one engine
    assert by_name["qwen3-32b"].devices == (0, 1) and len(by_name["qwen3-8b"].devices) == 1
    for d in range(2):
        assert sum(e.share for e in p.engines if d in e.devices) <= cfg.plan.max_device_share + 1e-9
    for e in p.engines:
        assert e.share_planned and e.devices_planned
        assert e.kv_bytes >= e.window_kv()  # vLLM starts only if one full window fits
    # The same number of full windows for both engines on the shared GPU (KV where the need is).
    ratios = [e.kv_bytes / e.window_kv() for e in p.engines]
    assert abs(ratios[0] - ratios[1]) < 0.03  # shares are rounded down to 0.001


def test_preflight_starts_engines_as_planned(models_root: Path) -> None:
    cfg = planned(
        cfg_for(
            [
                "narrator=qwen3",
                "player=qwen3",
                "auditor=qwen3_32b",
                f"plan.gpus=[{','.join(TWO)}]",
                f"models_root={models_root}",
            ]
        )
    )
    p = plan_mod.check(cfg)
    assert all(e.facts.on_disk and e.facts.weights_bytes == QWEN3[Path(e.model.path).name][3] for e in p.engines)
    out = plan_mod.planned(cfg)
    assert out.narrator.model == out.player.model  # still one engine for both
    assert out.auditor.model.devices == [0, 1] and out.narrator.model.devices in ([0], [1])
    assert out.narrator.model.gpu_memory_utilization + out.auditor.model.gpu_memory_utilization <= 0.9 + 1e-9
    assert len(engines_of(bind(out), ("narrator", "player", "auditor"))) == 2


def test_one_gpu_refuses_tensor_parallel_two_in_one_line(models_root: Path) -> None:
    cfg = planned(
        cfg_for(
            [
                "narrator=qwen3",
                "player=qwen3",
                "auditor=qwen3_32b",
                f"plan.gpus=[{','.join(ONE)}]",
                f"models_root={models_root}",
            ]
        )
    )
    with pytest.raises(ConfigError) as err:
        plan_mod.planned(cfg)
    text = str(err.value)
    assert "\n" not in text and text.startswith("config: auditor.model.tensor_parallel_size: plan: ")
    assert "qwen3-32b 61.0 GiB" in text and "more than 1 x 80.0 GiB" in text and "run on 2 GPUs" in text


def test_explicit_shares_over_one_gpu_are_refused_with_the_plans_split() -> None:
    over = [
        "narrator=qwen3",
        "player=qwen3",
        "auditor=qwen3_32b",
        f"plan.gpus=[{','.join(TWO)}]",
        "narrator.model.gpu_memory_utilization=0.9",
        "player.model.gpu_memory_utilization=0.9",
        "auditor.model.gpu_memory_utilization=0.9",
    ]
    p = plan_mod.check(cfg_for(over))
    msg = p.fatal[0].message
    assert "more than a whole GPU" in msg and "GPU 0 1.80" in msg
    split = dict(re.findall(r"(\w+)\.model\.gpu_memory_utilization=([\d.]+)", msg))
    assert set(split) == {"narrator", "player", "auditor"}  # every role of an engine, so they keep sharing it
    assert split["narrator"] == split["player"]
    # The split it suggests is a plan that works.
    fixed = over + [f"{r}.model.gpu_memory_utilization={v}" for r, v in split.items()]
    assert not plan_mod.check(cfg_for(fixed)).fatal


def test_explicit_share_too_small_for_one_window_is_refused() -> None:
    cfg = cfg_for(
        [
            "narrator=qwen3",
            "player=qwen3",
            "auditor=qwen3",
            f"plan.gpus=[{','.join(ONE)}]",
            "narrator.model.gpu_memory_utilization=0.2",
            "player.model.gpu_memory_utilization=0.2",
            "auditor.model.gpu_memory_utilization=0.2",
        ]
    )
    msg = plan_mod.check(cfg).fatal[0].message
    # 15.3 GiB of weights + 3 GiB overhead + one 40960-token window (5.6 GiB) of 80 GiB: 0.2986, rounded up.
    assert "less than one 40960-token request" in msg and "gpu_memory_utilization=0.30 or more" in msg


def test_devices_beyond_the_inventory_are_refused() -> None:
    cfg = planned(cfg_for(["experiment=auditor_sensitivity", "auditor=qwen3", f"plan.gpus=[{','.join(ONE)}]"]))
    p = plan_mod.check(cfg)
    assert p.fatal and p.fatal[0].field == "auditor.model.devices"


def test_output_reservation_without_prompt_room_is_refused() -> None:
    cfg = cfg_for(["player.max_tokens=8192"])  # the embedded model's window is 8192
    with pytest.raises(ConfigError, match=r"player\.max_tokens: plan: .*leaves no room for a prompt"):
        plan_mod.planned(cfg)


def test_cpu_embedded_run_gets_the_ram_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: the CPU
    cfg = cfg_for([])
    # The one engine the three roles share gets plan.cpu_share of the RAM; nothing else changes.
    shared = {
        r: getattr(cfg, r).model_copy(
            update={"model": getattr(cfg, r).model.model_copy(update={"gpu_memory_utilization": cfg.plan.cpu_share})}
        )
        for r in ("narrator", "player", "auditor")
    }
    assert plan_mod.planned(cfg) == cfg.model_copy(update=shared)
    p = plan_mod.check(cfg)
    assert p.inventory.kind == "cpu" and not p.device_lines
    # vLLM's CPU worker: the share of the node's RAM, less the weights and the worker's runtime, is KV cache.
    e = p.engines[0]
    assert e.kv_bytes == int(0.3 * p.inventory.ram_bytes) - e.weights_bytes - CPU_RUNTIME_BYTES


# ---- the GPU commands of the README and the docs, and the presets, on fake inventories --------------------------


def _expand(tokens: list[str]) -> list[list[str]]:
    """A sweep (`k=a,b`) as its single runs; brackets are lists, not sweeps."""
    choices = []
    for t in tokens:
        key, _, value = t.partition("=")
        if "," in value and not value.startswith("["):
            choices.append([f"{key}={v}" for v in value.split(",")])
        else:
            choices.append([t])
    return [list(c) for c in itertools.product(*choices)]


def readme_gpu_commands() -> list[list[str]]:
    """Every `run.py` line of the README and the docs that puts a role on a GPU model (not the embedded one),
    each command once (the lines as tests/documented_commands.py reads them)."""
    out: list[list[str]] = []
    for cmd in every_command():
        if cmd.script != "run.py":
            continue
        tokens = list(cmd.args)
        # A command for a larger node (8 x H200) is planned on its own hardware by test_presets_plan.py.
        hardware = [t.partition("=")[2].strip("[]") for t in tokens if t.startswith("plan.gpus=")]
        if hardware and sum(len(parse_gpus(g)) for g in hardware[0].split(",")) > len(TWO):
            continue
        # Not what is planned: the mode, other modes' inputs, and the hardware (the test gives its own).
        tokens = [
            t for t in tokens if "=" in t and not t.startswith(("mode=", "runs=", "out_dir=", "review.", "plan.gpus="))
        ]
        roles = [t for t in tokens if re.match(r"(narrator|player|auditor)=", t)]
        if roles and any(not t.endswith("=smollm2") for t in roles):
            out.extend(c for c in _expand(tokens) if c not in out)
    return out


def preset_commands() -> list[list[str]]:
    out = []
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        sweep = (OmegaConf.load(path).get("hydra") or {}).get("sweeper", {}).get("params", {}) or {}
        out.extend(_expand([f"experiment={path.stem}", *(f"{k}={v}" for k, v in sweep.items())]))
    return out


def test_readme_lists_gpu_commands() -> None:
    cmds = readme_gpu_commands()
    assert any("auditor=qwen3_32b" in c for c in cmds)
    assert len(preset_commands()) >= 4  # auditor_sensitivity's four auditors at least


@pytest.mark.parametrize("overrides", readme_gpu_commands() + preset_commands(), ids=" ".join)
def test_gpu_commands_fit_two_gpus_and_say_what_to_change_on_one(overrides: list[str]) -> None:
    cfg = planned(cfg_for(overrides + [f"plan.gpus=[{','.join(TWO)}]"]))
    p = plan_mod.check(cfg)
    assert not p.fatal, [f.message for f in p.fatal]
    one = plan_mod.check(planned(cfg_for(overrides + [f"plan.gpus=[{','.join(ONE)}]"])))
    needs_two = any(e.tp > 1 for e in one.engines) or any(
        getattr(cfg, r).model.devices and max(getattr(cfg, r).model.devices) >= 1 for r in ROLES
    )
    if needs_two:
        assert one.fatal and one.fatal[0].field.split(".")[-1] in ("tensor_parallel_size", "devices")
    for f in one.fatal:  # one line that says what to change
        assert "\n" not in f.message and re.search(r": (set|run on|give|lower|raise|choose|fix) ", f.message), f


# ---- prompt growth and the projection --------------------------------------------------------------------


def test_fit_line_and_first_turn_over() -> None:
    line = fit_line({1: 1100.0, 2: 1200.0, 3: 1300.0, 4: 1400.0})
    assert (round(line.base), round(line.slope)) == (1000, 100)
    assert line.first_over(1350, 1, 100) == 4 and line.first_over(10**6, 1, 100) is None
    assert Line(5000, 0).first_over(4000, 1, 100) == 1
    assert fit_line({3: 7.0}) == Line(7.0, 0.0)


def test_projection_follows_the_rig_and_predicts_later_turns() -> None:
    # Fit on turns 1-3, then play 6 turns: the line must predict turn 6 closely.
    short = plan_full(cfg_for(["plan.fit_turns=3"]))
    long = plan_full(cfg_for(["plan.fit_turns=6"]))
    stages = set(short.growth.stages)
    assert {
        "opening",
        "narrate",
        "player",
        "fact_update",
        "conflict_check",
        "double_check",
        "status_check",
        "trajectory_check",
    } <= stages
    for stage in ("narrate", "player", "status_check", "conflict_check"):
        fitted = short.growth.stages[stage].line.at(6)
        seen = long.growth.stages[stage].line.at(6)
        assert abs(fitted - seen) / seen < 0.05, (stage, fitted, seen)
        assert short.growth.stages[stage].line.slope > 0  # the history grows every turn


def test_projection_comes_from_the_templates(tmp_path: Path) -> None:
    pack = tmp_path / "pack"
    pack.mkdir()
    for f in (ROOT / "prompts").glob("*.txt"):
        (pack / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    extra = " ".join(["lantern"] * 400)
    (pack / "narrate.txt").write_text(
        (pack / "narrate.txt").read_text(encoding="utf-8") + "\n" + extra, encoding="utf-8"
    )
    base = plan_full(cfg_for([])).growth.stages["narrate"].line
    longer = plan_full(cfg_for([f"prompts.dir={pack}"])).growth.stages["narrate"].line
    assert 390 <= longer.base - base.base <= 820  # the added words, in the tokenizer's tokens
    assert abs(longer.slope - base.slope) < 2  # same growth per turn


def test_overflow_turn_is_found_and_the_plan_says_what_to_change(tmp_path: Path) -> None:
    cfg = cfg_for(["max_turns=60"])  # the embedded model's 8192 tokens do not hold 60 turns
    p = plan_full(cfg)
    row = p.overflow
    assert row is not None and 1 <= row.first_over <= 60
    g, limit = row.growth, row.window - row.need
    assert g.prompt_at(row.first_over) > limit and (row.first_over == 1 or g.prompt_at(row.first_over - 1) <= limit)
    code, text = plan_mod.verdict(p)
    assert code == plan_mod.OVERFLOW and f"at turn {row.first_over}" in text
    assert f"max_turns={row.first_over - 1}" in text  # the model holds no more than 8192


def test_measured_growth_from_a_call_log(tmp_path: Path) -> None:
    calls = [
        {
            "spec_id": "a",
            "stage": "narrate",
            "role": "narrator",
            "model": "m",
            "attempt": 0,
            "seed": t,
            "turn": t,
            "prompt_tokens": 1000 + 300 * t,
            "generated_tokens": 180,
        }
        for t in range(5)
    ]
    (tmp_path / "calls.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    p = plan_full(cfg_for([f"plan.measured={tmp_path}", "max_turns=30"]))
    g = p.growth.stages["narrate"]
    assert round(g.line.slope) == 300 and g.need == 180
    # Call-log turn t is the plan's turn t + 1: 700 + 300 x turn + 180 > 8192 first at turn 25.
    assert p.rows[0].first_over == 25
    with pytest.raises(ConfigError, match="plan.measured"):
        plan_full(cfg_for([f"plan.measured={tmp_path / 'none'}"]))


# ---- the entry point --------------------------------------------------------------------------------------


def test_mode_plan_cpu_default_prints_the_plan_and_goes(tmp_path: Path) -> None:
    proc = _run("mode=plan", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "the plan is for the CPU" in out and "GPU checks skipped" in out
    assert re.search(r"KV cache \d+ KiB/token \(30 layers x 3 KV heads x 64 head dim", out)
    assert out.strip().splitlines()[-1].startswith("verdict: go:")
    assert "| narrate | narrator | smollm2-135m-instruct | 8192 |" in out


@pytest.mark.engine_libs
def test_mode_run_refuses_an_impossible_plan_before_loading(tmp_path: Path, models_root: Path) -> None:
    proc = _run(
        "narrator=qwen3",
        "player=qwen3",
        "auditor=qwen3_32b",
        "plan.gpus=[H100-80GB]",
        f"models_root={models_root}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config: auditor.model.tensor_parallel_size: plan: ")
    assert not (tmp_path / "runs").exists()
    # Weights that are not there at all: the run's own path check says so first, not the plan.
    proc = _run(
        "narrator=qwen3",
        "player=qwen3",
        "auditor=qwen3_32b",
        "plan.gpus=[H100-80GB]",
        f"models_root={tmp_path / 'none'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and ".model.path" in proc.stderr and "plan:" not in proc.stderr


def test_readme_paper_command_is_caught(official_dataset: Path, tmp_path: Path) -> None:
    """The paper command without player=qwen3 keeps the embedded player: 8192 tokens do not hold 100 turns."""
    base = [
        "experiment=paper",
        "dataset=ncp_bench",
        f"dataset.path={official_dataset}",
        "narrator=qwen3",
        "auditor=qwen3_32b",
        f"plan.gpus=[{','.join(TWO)}]",
    ]
    p = plan_full(planned(cfg_for(base)))
    assert not p.fatal
    row = p.overflow
    assert row is not None and row.role == "player" and row.first_over < 100
    # With the player on Qwen3 too (the must-show): go, nothing overflows by turn 100.
    p = plan_full(planned(cfg_for(base + ["player=qwen3"])))
    code, text = plan_mod.verdict(p)
    assert code == plan_mod.GO and p.overflow is None, text
    assert p.growth is not None and "movie" in p.growth.source


def test_acceptance_script_skips_models_without_weights_and_fails_when_none_ran(tmp_path: Path) -> None:
    """The script's logic without an engine: a model not on this machine is skipped, said so; none ran: exit 1."""
    out = tmp_path / "acc"
    proc = subprocess.run(
        [str(ROOT / "scripts" / "gpu_acceptance.sh"), "--models", "qwen3", "--out", str(out), "--", "engine=scripted"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "PY": sys.executable},
    )
    assert proc.returncode == 1, proc.stderr
    table = (out / "summary.md").read_text()
    assert "| plan | engine=scripted | go |" in table
    assert re.search(r"\| run \| qwen3 \| skip \| \d+ \| weights not found at \S*Qwen3-8B", table)
    assert "| determinism | - | fail | 0 | no model ran" in table
    assert not (out / "qwen3").exists()  # nothing started for it


def test_plan_says_what_admission_by_cache_runs_and_what_offload_would_hold() -> None:
    """Per engine and listed turn: the episodes whose prefixes the KV cache holds (capacity over every
    stage's prompt + answer there, as execution/admission.py counts), what admission runs, and beyond
    max_turns' fit, the recompute without admission and the offload size that would hold the rest."""
    cfg = planned(
        cfg_for(
            [
                "experiment=paper",
                "narrator=qwen3",
                "player=qwen3",
                "auditor=qwen3_32b",
                "max_turns=100",
                f"plan.gpus=[{','.join(TWO)}]",
            ]
        )
    )
    plan = plan_full(cfg)
    lines = plan_mod.render(plan)
    for e in plan.engines:
        adm = next(
            line
            for line in lines[lines.index(next(x for x in lines if x.startswith(f"engine {e.index + 1}:"))) :]
            if line.startswith("  admission by cache")
        )
        cells = re.findall(r"turn (\d+): ([\d.]+) fit, (\d+) admitted", adm)
        assert [int(t) for t, _, _ in cells] == [0, 1, 10, 25, 50, 100]
        for t, fit, admitted in cells:
            expect = e.capacity_tokens() / plan_mod.footprint_at(plan, e, int(t))
            assert float(fit) == pytest.approx(expect, abs=0.06)
            assert int(admitted) == max(1, min(64, int(expect)))
        fits = [float(f) for _, f, _ in cells[1:]]
        assert fits == sorted(fits, reverse=True) and fits[-1] < 8  # prompts grow; at turn 100 few fit
    text = "\n".join(lines)
    assert re.search(r"without offload: admission keeps \d+ of 64 episodes in flight at turn 100", text)
    sizes = [int(g) for g in re.findall(r"kv_offloading_size=(\d+) \(GiB", text)]
    assert len(sizes) == len(plan.engines) and all(g > 0 for g in sizes)
