"""Engine configuration on the embedded model's real files (no engine started):
vLLM's own model config accepts the shipped window and settings; the OpenAI
backend's request body. Schema and engine-argument checks that need no model
are in tests/test_engine_args.py."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ncp_local import config as config_mod
from ncp_local.engines.base import Message, Request
from ncp_local.engines.openai import OpenAIEngine
from ncp_local.engines.vllm_args import build_engine_args, engine_config

MODEL = {
    "name": "m",
    "path": "embedded",
    "dtype": "bfloat16",
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.3,
    "tensor_parallel_size": 1,
    "devices": [],
    "chat_template_kwargs": {"enable_thinking": False},
    "structured_outputs_backend": "xgrammar",
    "enforce_eager": True,
    "max_num_seqs": 8,
    "revision": "abc",
}


def test_shipped_embedded_config_is_one_vllm_accepts(embedded_model_path: Path) -> None:
    raw = OmegaConf.to_container(config_mod.compose([]), resolve=True)
    model = config_mod.validate(raw).narrator.model  # type: ignore[arg-type]
    args = build_engine_args(engine_config(model), embedded_model_path, on_cpu=True)
    mc = args.create_model_config()
    assert mc.max_model_len == model.max_model_len == 8192
    assert str(mc.dtype) == "torch.float32" and mc.served_model_name == model.name
    assert args.max_num_batched_tokens >= 8192 and args.enable_chunked_prefill is False


def test_openai_from_config_and_request_body() -> None:
    backend = OpenAIEngine.from_config(
        model=MODEL, engine={"name": "openai", "base_url": "http://127.0.0.1:8000/v1", "max_concurrency": 4}
    )
    assert backend.cfg.model == "m" and backend.cfg.max_concurrency == 4
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    req = Request(
        messages=(Message("user", "hi"),), temperature=0.5, top_p=0.9, max_tokens=7, seed=3, json_schema=schema
    )
    body = backend._body(req)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }
    assert body["seed"] == 3 and body["max_tokens"] == 7 and body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert body["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}
    plain = backend._body(Request(messages=req.messages, temperature=0, top_p=1, max_tokens=5, seed=1))
    assert "response_format" not in plain
