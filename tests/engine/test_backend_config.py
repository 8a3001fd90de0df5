"""Backend configuration: from the run config to engine arguments and request bodies (no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ncp_local.llm.base import Message, Request
from ncp_local.llm.openai_backend import OpenAIBackend
from ncp_local.llm.vllm_backend import EngineModelConfig, _engine_args

MODEL = {
    "name": "m", "path": "embedded", "dtype": "bfloat16", "max_model_len": 4096, "gpu_memory_utilization": 0.3,
    "tensor_parallel_size": 1, "devices": [], "chat_template_kwargs": {"enable_thinking": False},
    "structured_outputs_backend": "xgrammar", "enforce_eager": True, "max_num_seqs": 8, "revision": "abc",
}


def test_from_model_drops_bookkeeping_and_rejects_typos() -> None:
    cfg = EngineModelConfig.from_model(MODEL)
    assert cfg.max_num_seqs == 8 and cfg.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ValueError, match="max_num_seq"):
        EngineModelConfig.from_model({**MODEL, "max_num_seq": 3})


def test_cpu_engine_args_prefill_whole_prompts(embedded_model_path: Path) -> None:
    args = _engine_args(EngineModelConfig.from_model(MODEL), embedded_model_path, on_cpu=True)
    assert args.enable_chunked_prefill is False
    assert args.max_num_batched_tokens >= 4096 + 8
    assert args.structured_outputs_config.backend == "xgrammar"
    assert args.structured_outputs_config.disable_any_whitespace is True
    assert args.enable_prefix_caching is True and args.generation_config == "vllm"
    with pytest.raises(ValueError, match="chunked"):
        _engine_args(EngineModelConfig.from_model({**MODEL, "enable_chunked_prefill": True}), embedded_model_path, True)
    gpu = _engine_args(EngineModelConfig.from_model(MODEL), embedded_model_path, on_cpu=False)
    assert gpu.enable_chunked_prefill is None  # vLLM decides


def test_outlines_gets_no_whitespace_flag(embedded_model_path: Path) -> None:
    # vLLM accepts disable_any_whitespace only for xgrammar and guidance.
    cfg = EngineModelConfig.from_model({**MODEL, "structured_outputs_backend": "outlines"})
    args = _engine_args(cfg, embedded_model_path, on_cpu=True)
    assert args.structured_outputs_config.backend == "outlines"
    assert args.structured_outputs_config.disable_any_whitespace is False


def test_openai_from_config_and_request_body() -> None:
    backend = OpenAIBackend.from_config(
        model=MODEL, engine={"name": "openai", "base_url": "http://127.0.0.1:8000/v1", "max_concurrency": 4}
    )
    assert backend.cfg.model == "m" and backend.cfg.max_concurrency == 4
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    req = Request(messages=(Message("user", "hi"),), temperature=0.5, top_p=0.9, max_tokens=7, seed=3, json_schema=schema)
    body = backend._body(req)
    assert body["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}
    }
    assert body["seed"] == 3 and body["max_tokens"] == 7 and body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert body["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}
    plain = backend._body(Request(messages=req.messages, temperature=0, top_p=1, max_tokens=5, seed=1))
    assert "response_format" not in plain
