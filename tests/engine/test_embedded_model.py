"""The embedded model: found in its wheel, verified, converted once, cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ncp_local.engines import embedded


def test_converted_model_is_complete(embedded_model_path: Path) -> None:
    marker = json.loads((embedded_model_path / embedded.MARKER_FILE).read_text())
    assert marker["gguf_sha256"] == embedded.EMBEDDED_GGUF_SHA256
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (embedded_model_path / name).is_file(), name
    config = json.loads((embedded_model_path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    # Dequantized into bf16: about 270 MB (float32 would be twice that).
    assert 200e6 < (embedded_model_path / "model.safetensors").stat().st_size < 350e6


def test_second_call_converts_nothing(embedded_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("a prepared model was converted again")

    monkeypatch.setattr(embedded, "_convert", refuse)
    monkeypatch.setattr(embedded, "sha256_file", refuse)  # nor is the 100 MB GGUF hashed again
    assert embedded.ensure_embedded_model() == embedded_model_path


def test_gguf_is_found_without_importing_the_package() -> None:
    import sys

    path = embedded.find_embedded_gguf()
    assert path.name == embedded.EMBEDDED_GGUF and path.is_file()
    # Its __init__ imports `llm`/`llama_cpp`, which are not installed.
    assert embedded.EMBEDDED_PACKAGE not in sys.modules


def test_missing_package_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embedded, "EMBEDDED_DISTRIBUTION", "no-such-dist-xyz")
    monkeypatch.setattr(embedded, "EMBEDDED_PACKAGE", "no_such_pkg_xyz")
    with pytest.raises(embedded.EmbeddedModelError, match="no-such-dist-xyz.*not installed"):
        embedded.ensure_embedded_model(tmp_path)


def test_wrong_checksum_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embedded, "EMBEDDED_GGUF_SHA256", "0" * 64)
    with pytest.raises(embedded.EmbeddedModelError, match="expected 0000"):
        embedded.ensure_embedded_model(tmp_path)
    assert not embedded.embedded_model_dir(tmp_path).exists()
    # Nothing half-built is left in the cache either.
    assert [p.name for p in embedded.embedded_model_dir(tmp_path).parent.iterdir()] == [
        f".{embedded.EMBEDDED_MODEL_NAME}.lock"
    ]


def test_cache_root_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NCP_LOCAL_CACHE", str(tmp_path))
    assert embedded.embedded_model_dir() == tmp_path / "models" / embedded.EMBEDDED_MODEL_NAME
    monkeypatch.delenv("NCP_LOCAL_CACHE")
    assert embedded.cache_root() == Path.home() / ".cache" / "ncp-local"


def test_conversion_is_atomic_and_idempotent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The cache logic around the (slow, real) conversion, with a stand-in converter."""
    calls = []

    def fake_convert(gguf: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            (out_dir / name).write_text("{}")

    monkeypatch.setattr(embedded, "_convert", fake_convert)
    target = embedded.ensure_embedded_model(tmp_path)
    assert target == embedded.embedded_model_dir(tmp_path) and (target / embedded.MARKER_FILE).is_file()
    assert embedded.ensure_embedded_model(tmp_path) == target
    assert len(calls) == 1 and calls[0] != target  # built elsewhere, renamed into place

    def failing_convert(gguf: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("killed midway")

    monkeypatch.setattr(embedded, "_convert", failing_convert)
    with pytest.raises(RuntimeError, match="killed midway"):
        embedded.ensure_embedded_model(tmp_path, force=True)
    assert embedded._is_complete(target)  # the good copy is untouched
    leftovers = {p.name for p in target.parent.iterdir()} - {target.name, f".{target.name}.lock"}
    assert not leftovers

    # A copy made by an older conversion is rebuilt and replaced.
    monkeypatch.setattr(embedded, "_convert", fake_convert)
    monkeypatch.setattr(embedded, "CONVERSION_VERSION", embedded.CONVERSION_VERSION + 1)
    assert not embedded._is_complete(target)
    assert embedded.ensure_embedded_model(tmp_path) == target
    assert len(calls) == 2 and embedded._is_complete(target)
    assert {p.name for p in target.parent.iterdir()} == {target.name, f".{target.name}.lock"}
