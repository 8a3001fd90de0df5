"""The whole run config (`RunConfig`) and its validation: the resolved Hydra mapping in, a typed record
out, or a `ConfigError` that names the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator

from ..errors import InputError, shown
from .sections import (
    ENGINES,
    AuditCfg,
    BenchCfg,
    CompareCfg,
    ConfigModel,
    DatasetCfg,
    EngineCfg,
    ExportCfg,
    PlanCfg,
    PlantCfg,
    ReportCfg,
    ReviewCfg,
    RoleCfg,
    ShardCfg,
    StatusCfg,
    TrackerCfg,
    TrialsCfg,
)
from .suggest import dotted_keys, unknown_key


class ConfigError(InputError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__("config", field, message)


class RunConfig(ConfigModel):
    """The resolved config, typed once at the entry; every layer below the modes takes it (or a part)."""

    # The composed config as plain data, as the entry read it (`source`): what a run's manifest records and
    # what its identity hashes. Private: not a key of the config, and kept by `model_copy`.
    _source: dict[str, Any] = PrivateAttr(default_factory=dict)

    @property
    def source(self) -> dict[str, Any]:
        """The composed config this was validated from, as plain data (read it, never change it)."""
        return self._source

    mode: str = "run"
    seed: int = 0
    max_turns: int = Field(3, ge=1)
    limit: int | None = Field(None, ge=1)
    out_dir: str | None = None
    concurrency: int = Field(64, ge=1)
    # Ask the next turn's player while this turn's audits run: same results, one call less on each
    # surviving turn's chain; the answers of turns that never happen are logged `speculative`.
    speculative_player: bool = True
    # A finished run with more than this share of its episodes invalid for one reason exits 5.
    max_invalid_share: float = Field(0.5, ge=0, le=1)
    progress: bool = True
    # Without a terminal (Slurm logs, pipes): one plain progress line this often (ncp_local/execution/progress.py).
    progress_every_s: float = Field(30.0, gt=0)
    # false: engine and library output goes to engine.log, the terminal shows the rig's lines
    # (ncp_local/execution/engine_log.py); true: it streams to the terminal as well.
    verbose: bool = False
    engine: EngineCfg
    dataset: DatasetCfg
    narrator: RoleCfg
    player: RoleCfg
    auditor: RoleCfg
    method: dict[str, Any]  # checked against the narrator's own Options (roles.narrator_options)
    condition: dict[str, Any]
    prompts: dict[str, Any] = {}
    shard: ShardCfg = ShardCfg()
    trials: TrialsCfg = TrialsCfg()
    runs: list[str] = []  # run directories read by report, reaudit and review
    bench: BenchCfg = BenchCfg()
    sources: str | None = None  # mode=build: the synopsis sources file
    out: str | None = None  # mode=build: where the built specs go
    report: ReportCfg = ReportCfg()
    compare: CompareCfg = CompareCfg()
    export: ExportCfg = ExportCfg()
    status: StatusCfg = StatusCfg()
    tracker: TrackerCfg = TrackerCfg()
    submission: str | None = None  # mode=submission: the archive to write; mode=validate: the archive to check
    review: ReviewCfg = ReviewCfg()
    audit: AuditCfg = AuditCfg()
    plan: PlanCfg = PlanCfg()
    plant: PlantCfg = PlantCfg()  # mode=plant
    models_root: str | None = None  # interpolated into model paths (conf/model/*.yaml)
    from_: str | None = Field(None, alias="from")  # mode=rerun: the run directory to repeat

    @property
    def optional_templates(self) -> tuple[str, ...]:
        return self.audit.templates

    @property
    def method_name(self) -> str:
        return str(self.method.get("name", "baseline"))

    @property
    def method_options(self) -> dict[str, Any]:
        """Everything under `method` except its name goes to the narrator's constructor."""
        return {k: v for k, v in self.method.items() if k != "name"}

    @property
    def condition_name(self) -> str:
        return str(self.condition.get("name", ""))

    @field_validator("method")
    @classmethod
    def _method_name(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(v.get("name", "baseline"), str):
            raise ValueError(f"method.name must be a string, got {shown(v.get('name'))}")
        return v

    @field_validator("trials", mode="before")
    @classmethod
    def _trials_group(cls, v: Any) -> Any:
        # Hydra lets `trials=4` replace the whole group: say the spelling that works.
        if not isinstance(v, dict | TrialsCfg):
            raise ValueError(f"{shown(v)} is not the trials group: set trials.count=N (and trials.vary=...)")
        return v

    @field_validator("condition", "prompts")
    @classmethod
    def _closed_sections(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # Kept as mappings (read with .get); their keys are fixed all the same.
        known = {"condition": ("name",), "prompts": ("dir",)}[str(info.field_name)]
        extra = sorted(str(k) for k in v if k not in known)
        if extra:
            raise ValueError(f"unknown key {shown(extra[0])} (known: {', '.join(known)})")
        for key in known:
            if v.get(key) is not None and not isinstance(v[key], str):
                raise ValueError(f"{key} must be a string, got {shown(v[key])}")
        return v


def validate(raw: dict[str, Any]) -> RunConfig:
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        if err["type"] in ("union_tag_invalid", "union_tag_not_found") and loc == ["engine"]:
            # The tag is the engine's name: say so, and the names it can be (not the whole mapping).
            tag = (err.get("ctx") or {}).get("tag")
            got = f"{shown(tag)} is not an engine" if err["type"] == "union_tag_invalid" else "missing"
            raise ConfigError(
                "engine.name", f"{got}: one of {', '.join(ENGINES)} (engine=NAME picks conf/engine/NAME.yaml)"
            ) from None
        if len(loc) > 1 and loc[0] == "engine" and loc[1] in ENGINES:
            del loc[1]  # the union's tag: `engine.delay_s`, not `engine.scripted.delay_s`
        field = ".".join(loc)
        field = field if len(field) <= 120 else field[:117] + "..."  # a key can be as long as the user typed it
        if err["type"] == "extra_forbidden":  # `+max_turn=4`: Hydra appended it, the schema has no such key
            keys = (k for k in dotted_keys(raw) if k != field and not k.startswith(field + "."))
            raise ConfigError(field, unknown_key(field, keys)) from None
        if err["type"] == "value_error":  # our own validators: the message names what is wrong
            raise ConfigError(field, err["msg"].removeprefix("Value error, ")) from None
        raise ConfigError(field, f"{err['msg']} (got {shown(err.get('input'))})") from None
    cfg._source = raw
    return cfg


def dataset_path(cfg: RunConfig) -> Path:
    if not cfg.dataset.path:
        raise ConfigError(
            "dataset.path", f"not set for dataset {cfg.dataset.name!r} (pass dataset.path=DIR or set NCP_BENCH_DATASET)"
        )
    return Path(cfg.dataset.path).expanduser()
