"""The resolved Hydra config as typed, validated records.

Validation happens here, before any spec or model loads; every error names
the config field. Run identity (the hash that names the run directory)
comes from the settings that change results, not from bookkeeping ones.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .spec import SpecError

REPO_ROOT = Path(__file__).resolve().parent.parent
# Keys that never change what a run computes, so they stay out of its identity.
NOT_IDENTITY = ("mode", "out_dir", "concurrency", "progress", "hydra", "limit", "runs", "report", "review",
                "shard",
                "engine.delay_s", "engine.die_after_calls", "out", "bench")


class ConfigError(SpecError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__("config", field, message)


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ModelCfg(_Cfg):
    name: str
    path: str
    dtype: str = "auto"
    max_model_len: int = Field(8192, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)
    devices: list[int] = []
    chat_template_kwargs: dict[str, Any] = {}
    structured_outputs_backend: Literal["xgrammar", "guidance", "outlines"] = "xgrammar"
    enforce_eager: bool = False
    max_num_seqs: int = Field(64, ge=1)
    revision: str | None = None


class RoleCfg(_Cfg):
    model: ModelCfg
    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_tokens: int = Field(512, gt=0)


class EngineCfg(_Cfg):
    name: Literal["vllm", "scripted", "openai"]


class DatasetCfg(_Cfg):
    name: str
    path: str | None


class ShardCfg(_Cfg):
    index: int = Field(0, ge=0)
    count: int = Field(1, ge=1)


class ReportCfg(_Cfg):
    """`mode=report`: where to write and how to compute the intervals."""

    out: str | None = None  # null: <first run>/report
    resamples: int = Field(2000, ge=1)
    seed: int = 0
    level: float = Field(0.95, gt=0, lt=1)
    dataset: str | None = None  # null: the dataset path in each run's manifest
    html: bool = True


class ReviewCfg(_Cfg):
    """`mode=review`: export a sample of conflict terminations, or read a filled sheet back."""

    n: int = Field(20, ge=1)
    seed: int = 0
    out: str | None = None  # null: <first run>/review
    sheet: str | None = None  # a filled review CSV: report its disputed rate


class BenchCfg(_Cfg):
    episodes: int = Field(16, ge=1)
    turns: int = Field(4, ge=1)
    throughput: float | None = Field(None, gt=0)  # tokens/s per GPU for the cost projection
    sequential: bool = True
    # The sequential way on the first N episodes only (its tokens/s is what is compared); null = all.
    sequential_episodes: int | None = Field(None, ge=1)


class RunConfig(_Cfg):
    mode: str = "run"
    seed: int = 0
    max_turns: int = Field(3, ge=1)
    limit: int | None = Field(None, ge=1)
    out_dir: str | None = None
    concurrency: int = Field(64, ge=1)
    progress: bool = True
    engine: EngineCfg
    dataset: DatasetCfg
    narrator: RoleCfg
    player: RoleCfg
    auditor: RoleCfg
    method: dict[str, Any]
    condition: dict[str, Any]
    prompts: dict[str, Any] = {}
    shard: ShardCfg = ShardCfg()
    runs: list[str] = []  # run directories read by report, reaudit and review
    bench: BenchCfg = BenchCfg()
    sources: str | None = None  # mode=build: the synopsis sources file
    out: str | None = None  # mode=build: where the built specs go
    report: ReportCfg = ReportCfg()
    review: ReviewCfg = ReviewCfg()


def validate(raw: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        got = repr(err.get("input"))
        got = got if len(got) <= 80 else got[:77] + "..."
        raise ConfigError(field, f"{err['msg']} (got {got})") from None


def _without(raw: dict[str, Any], skip: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in raw.items():
        path = f"{prefix}{k}"
        if path in skip:
            continue
        out[k] = _without(v, skip, path + ".") if isinstance(v, dict) else v
    return out


def identity(raw: dict[str, Any]) -> str:
    kept = _without(raw, NOT_IDENTITY)
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


def dataset_path(cfg: RunConfig) -> Path:
    if not cfg.dataset.path:
        raise ConfigError("dataset.path", f"not set for dataset {cfg.dataset.name!r} "
                          "(pass dataset.path=DIR or set NCP_BENCH_DATASET)")
    return Path(cfg.dataset.path).expanduser()


def run_dir(cfg: RunConfig, raw: dict[str, Any]) -> Path:
    if cfg.out_dir:
        return Path(cfg.out_dir).expanduser()
    return Path("runs") / f"{cfg.dataset.name}-{identity(raw)}"


def shard_specs(cfg: RunConfig, specs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Task i of n takes specs i, i+n, i+2n, ... (balanced; stable for a given index)."""
    if cfg.shard.count == 1:
        # Unsharded: the whole run, whatever $SLURM_ARRAY_TASK_ID says (Hydra's
        # submitit launcher runs each sweep point as a task of an array job).
        return specs
    if cfg.shard.index >= cfg.shard.count:
        raise ConfigError("shard.index", f"{cfg.shard.index} is not below shard.count={cfg.shard.count}")
    return specs[cfg.shard.index::cfg.shard.count]


def shard_dir(cfg: RunConfig, root: Path) -> Path:
    """Each array task writes only under its own directory; merge joins them."""
    if cfg.shard.count == 1:
        return root
    return root / f"shard-{cfg.shard.index:03d}-of-{cfg.shard.count:03d}"


def compose(overrides: list[str], config_name: str = "config", hydra_config: bool = False) -> Any:
    """The config `run.py` would get for these overrides, outside `hydra.main`.

    Used to check overrides up front and by the Slurm submitter to name the
    run directory once. Raises Hydra's own exceptions (see `hydra_error_line`).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT), replace=True)
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name, overrides=overrides, return_hydra_config=hydra_config)


def hydra_error_line(exc: BaseException) -> str:
    """Hydra's multi-line composition error as one line (options listed inline)."""
    parts: list[str] = []
    options: list[str] = []
    for line in str(exc).split("Config search path:")[0].splitlines():
        if line.startswith("\t"):
            options.append(line.strip())
        elif line.strip() and not line.startswith("Available options"):
            parts.append(line.strip().rstrip("."))
    text = "; ".join(parts)
    if options:
        text += f" (available: {', '.join(options)})"
    return text
