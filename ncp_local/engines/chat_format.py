"""The prompt as the engine sees it: the one place that renders chat messages and counts their tokens.

vLLM does not render every model with a Jinja chat template: DeepSeek-V3.2 has a
Python encoder, a Mistral folder may load Mistral's own tokenizer, a model may
ship its tokenizer as remote code. So the rig renders with vLLM's own pieces:
a running engine's renderer (`AsyncLLM.renderer`, the chat path vLLM's server
takes: template resolution, message content format, template arguments) turns
the messages into token ids; without an engine (`mode=plan`) the tokenizer
comes from vLLM's registry (`vllm.tokenizers.get_tokenizer`, the call behind
`cached_tokenizer_from_config`) in the mode vLLM would pick, and renders through
its `apply_chat_template`, as vLLM's renderers call it. The engine receives the
token ids made here, so the context guard and the plan count what it runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..chat import Message
from .settings import ModelSettings

# When `tokenizer_mode` is `auto`, vLLM's ModelConfig picks these modes by architecture
# (config/model.py, the same in 0.32 and 0.33): these models have no Jinja template to render.
# Any other architecture is left to vLLM's registry: `mistral` for a folder with Mistral's
# own files, else `hf`.
ARCHITECTURE_TOKENIZER_MODES: dict[str, str] = {
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "DeepseekV4ForConditionalGeneration": "deepseek_v4",
    "DeepseekV41ForCausalLM": "deepseek_v41",
    "KimiK3ForConditionalGeneration": "kimi_k3",
    "MoonshotKimiaForCausalLM": "kimi_audio",
    "InklingForCausalLM": "inkling",
    "InklingForConditionalGeneration": "inkling",
}

# The chat-template arguments that switch a family's thinking on or off: Qwen3's
# `enable_thinking`, DeepSeek's and Kimi's `thinking`. Both follow `<role>.model.thinking`;
# a template that knows neither ignores them.
THINKING_TEMPLATE_KEYS = ("enable_thinking", "thinking")


def template_kwargs(cfg: ModelSettings) -> dict[str, Any]:
    """The chat-template arguments a request renders with: the model's, thinking set by its switch."""
    return {**cfg.chat_template_kwargs, **{key: cfg.thinking for key in THINKING_TEMPLATE_KEYS}}


def _config_json(model_path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def tokenizer_mode(model_path: Path, cfg: ModelSettings) -> str:
    """The tokenizer mode vLLM runs this model with: `engine_args.tokenizer_mode` if set, else vLLM's choice."""
    mode = str(cfg.engine_args.get("tokenizer_mode", "auto")).lower()
    if mode != "auto":
        return mode
    for arch in _config_json(model_path).get("architectures") or ():
        if arch in ARCHITECTURE_TOKENIZER_MODES:
            return ARCHITECTURE_TOKENIZER_MODES[arch]
    from vllm.tokenizers.registry import resolve_tokenizer_args

    return str(resolve_tokenizer_args(str(model_path), tokenizer_mode="auto")[0])


class NoChatTemplate(ValueError):
    """A Hugging Face tokenizer without a chat template: vLLM would refuse every chat request."""


@dataclass
class ChatFormat:
    """Messages -> the token ids the engine runs, with the tokenizer vLLM uses for this model."""

    tokenizer: Any
    mode: str  # vLLM's tokenizer mode: hf, mistral, deepseek_v32, ...
    kwargs: dict[str, Any]  # chat-template arguments (thinking set by the model's switch)
    # A running engine's renderer (vLLM's chat path); None: the tokenizer renders (mode=plan).
    renderer: Any = None

    def __post_init__(self) -> None:
        # vLLM's Hugging Face renderer refuses a chat request when the tokenizer has no template
        # (and transformers no longer has a default one); the other modes render without one.
        if self.mode == "hf" and not getattr(self.tokenizer, "chat_template", None):
            raise NoChatTemplate("has no chat template")

    @classmethod
    def load(cls, model_path: Path, cfg: ModelSettings) -> ChatFormat:
        """The tokenizer vLLM's registry loads for this folder, in the mode vLLM would pick."""
        from vllm.tokenizers import get_tokenizer

        mode = tokenizer_mode(model_path, cfg)
        # Runs are offline; Mistral's own tokenizer class takes no Hugging Face loading arguments.
        # Nothing else is added: vLLM loads it the same way (no fix_mistral_regex, for one).
        extra = {} if mode == "mistral" else {"local_files_only": True}
        tokenizer = get_tokenizer(
            str(model_path), tokenizer_mode=mode, trust_remote_code=cfg.trust_remote_code, **extra
        )
        return cls(tokenizer, mode, template_kwargs(cfg))

    @classmethod
    def of_engine(cls, engine: Any, cfg: ModelSettings) -> ChatFormat:
        """A running AsyncLLM's own renderer and tokenizer."""
        renderer = engine.renderer
        return cls(
            renderer.get_tokenizer(), str(engine.model_config.tokenizer_mode), template_kwargs(cfg), renderer=renderer
        )

    @staticmethod
    def _conversation(messages: Sequence[Message]) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in messages]

    def _rendered(self, messages: Sequence[Message]) -> Mapping[str, Any]:
        """vLLM's renderer output for one chat request, as its server builds it: text or token ids."""
        from vllm.renderers.params import ChatParams

        params = ChatParams(
            chat_template_kwargs={"add_generation_prompt": True, "continue_final_message": False, **self.kwargs}
        )
        prompt: Mapping[str, Any]
        _, prompt = self.renderer.render_messages(self._conversation(messages), params)
        return prompt

    def _apply(self, messages: Sequence[Message], tokenize: bool) -> Any:
        return self.tokenizer.apply_chat_template(
            self._conversation(messages),
            add_generation_prompt=True,
            tokenize=tokenize,
            return_dict=False,
            **self.kwargs,
        )

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text (for reading; the engine gets `tokenize`'s ids)."""
        if self.renderer is None:
            return str(self._apply(messages, tokenize=False))
        prompt = self._rendered(messages)
        if "prompt" in prompt:
            return str(prompt["prompt"])
        return str(self.tokenizer.decode(prompt["prompt_token_ids"]))

    def tokenize(self, messages: Sequence[Message]) -> list[int]:
        """The prompt's token ids as vLLM's chat path makes them: a text prompt is encoded without
        adding special tokens (the template holds any BOS), as vLLM's chat tokenization does."""
        if self.renderer is not None:
            prompt = self._rendered(messages)
            ids = prompt["prompt_token_ids"] if "prompt_token_ids" in prompt else str(prompt["prompt"])
        else:
            ids = self._apply(messages, tokenize=True)
        if isinstance(ids, str):
            return list(self.tokenizer.encode(ids, add_special_tokens=False))
        return [int(i) for i in ids]

    def count(self, messages: Sequence[Message]) -> int:
        return len(self.tokenize(messages))

    def count_text(self, text: str) -> int:
        """Tokens of a piece of generated text (without an end-of-turn token)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))
