"""The resolved Hydra config as typed, validated records.

Validation happens here, before any spec or model loads; every error names
the config field. Run identity (the hash that names the run directory)
comes from the settings that change results, not from bookkeeping ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, ValidationInfo, field_validator

from .engines.registry import KINDS
from .engines.settings import ModelSettings
from .errors import InputError, shown
from .protocol import ROLES
from .protocol.stages import Bounds
from .protocol.trials import ALL, varied_roles

REPO_ROOT = Path(__file__).resolve().parent.parent
# Keys that never change what a run computes, so they stay out of its identity
# (ncp_local/execution/identity.py): where things lie (paths, models_root: content is
# hashed instead), how fast or where it runs, other modes' settings. `limit` is
# out too: episodes are independent, a resume with another limit keeps them.
_PLACEMENT = (
    "path",
    "devices",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "tensor_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "max_num_seqs",
    "enforce_eager",
    "cpu_reserved_cores",
)
NOT_IDENTITY = (
    "mode",
    "out_dir",
    "concurrency",
    "speculative_player",
    "max_invalid_share",
    "progress",
    "progress_every_s",
    "verbose",
    "hydra",
    "limit",
    # Like `limit`: plays are independent, so raising it resumes the run and plays only the new trials.
    # (`trials.vary` is in the identity, unless it is the default: execution/identity.py.)
    "trials.count",
    "runs",
    "report",
    "review",
    "shard",
    "models_root",
    "dataset.path",
    "prompts.dir",
    "from",
    "plan",
    "engine.delay_s",
    "engine.die_after_calls",
    "engine.base_url",
    "engine.api_key_env",
    "engine.file",
    "engine.wait_s",
    "engine.backoff_s",
    "engine.timeout_s",
    "engine.max_retries",
    "engine.max_concurrency",
    "out",
    "bench",
    "sources",
    "export",
    "tracker",
    "submission",
    *(f"{role}.model.{key}" for role in ROLES for key in _PLACEMENT),
    # A role's engine and endpoint enter the identity as that role's model identity
    # (execution/identity.py: the engine when it differs from `engine`, the served model and
    # what the server reports), never as a URL; left out here so unchanged configs keep theirs.
    *(f"{role}.{key}" for role in ROLES for key in ("engine", "endpoint")),
)


def _vary_read(value: Any) -> Any:
    """`trials.vary` as the identity holds it: `all`, or the sorted roles (a list of every role is `all`);
    a value the config refuses is kept as given (its own check names it)."""
    try:
        roles = varied_roles(value)
    except (ValueError, TypeError):
        return value
    return ALL if roles == frozenset(ROLES) else sorted(roles)


# Keys added after runs existed: the value that plays exactly as before the key existed, and how a
# value reads in the identity. At that value the key (and a section left empty by it) stays out of
# the identity, so a run made before it keeps its identity and resumes; another value is another
# experiment. Labels show the value for a run that has no such key.
LATER_KEYS: dict[str, tuple[Any, Callable[[Any], Any]]] = {
    "audit.failure_modes": (False, lambda value: value),
    "trials.vary": (ALL, _vary_read),
}


SCRIPTED = "scripted"  # the engine name, and the label of whatever it "played"


class ConfigError(InputError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__("config", field, message)


class _Cfg(BaseModel):
    # Unknown keys are refused (`+narrator.temprature=0.1` must not pass), and
    # strict: `max_turns=true` is not 1, `progress=1` is not true (ints still
    # pass where a float is expected).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# The engine kinds (engines/registry.py); the Literal lets the config name them, and must agree.
EngineName = Literal["vllm", "scripted", "openai"]
ENGINES: tuple[str, ...] = tuple(KINDS)
assert set(get_args(EngineName)) == set(ENGINES), "config.EngineName and engines/registry.py disagree"


class EndpointCfg(_Cfg):
    """`<role>.endpoint`: the OpenAI-compatible server a role's calls go to when its engine is `openai`
    (engines/openai.py). Unset fields fall back to the top-level `engine=openai` group's."""

    base_url: str | None = None  # e.g. http://node12:8000/v1
    # A file holding the base URL, written by the server job once /health answers (slurm/serve.sbatch):
    # the run waits for it and for a healthy server, at most `wait_s` seconds.
    file: str | None = None
    wait_s: float = Field(900.0, ge=0)
    model: str | None = None  # the served model name; None: the role's model name
    api_key_env: str | None = None  # the environment variable holding the API key; None: no key
    timeout_s: float | None = Field(None, gt=0)  # per request
    # Connection errors, timeouts, 429 and 5xx: retried with exponential backoff, each try logged.
    max_retries: int | None = Field(None, ge=0)
    backoff_s: float | None = Field(None, ge=0)  # the first wait; doubled each retry (capped at 60 s)
    max_concurrency: int | None = Field(None, ge=1)  # requests in flight to this endpoint from this process
    vllm_extensions: bool | None = None  # the server is `vllm serve`: also constrain plain text (regex)


class RoleCfg(_Cfg):
    model: ModelSettings
    # `vllm`, `openai` or `scripted`; None: the top-level `engine`.
    engine: EngineName | None = None
    endpoint: EndpointCfg = EndpointCfg()
    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_tokens: int = Field(512, gt=0)
    # Output bounds for this role's answers (stages.Bounds): unbounded unless
    # set; the embedded model's role files set tight ones (PROTOCOL section 6).
    bounds: Bounds = Bounds()


class VLLMEngineCfg(_Cfg):
    """`engine=vllm`: in-process engines, one per distinct model (conf/engine/vllm.yaml)."""

    name: Literal["vllm"]
    deterministic: bool = False  # every GPU engine batch-invariant (see ModelSettings.deterministic)


class ScriptedEngineCfg(_Cfg):
    """`engine=scripted`: seeded schema-valid answers (engines/scripted.py RandomPolicy)."""

    name: Literal["scripted"]
    conflict_rate: float = Field(0.1, ge=0, le=1)
    overturn_rate: float = Field(0.3, ge=0, le=1)
    node_rate: float = Field(0.35, ge=0, le=1)
    satisfy_rate: float = Field(0.25, ge=0, le=1)
    delay_s: float = Field(0.0, ge=0)  # simulated latency per call
    die_after_calls: int | None = Field(None, ge=0)  # fault injection: EngineDead from this call on


class OpenAIEngineCfg(_Cfg):
    """`engine=openai`: an OpenAI-compatible endpoint (engines/openai.py), the default of every
    role's `endpoint` (`<role>.endpoint.*` overrides it per role).

    None leaves the endpoint's own default (OpenAIEndpointConfig) in place."""

    name: Literal["openai"]
    base_url: str | None = None
    file: str | None = None
    wait_s: float | None = Field(None, ge=0)
    backoff_s: float | None = Field(None, ge=0)
    model: str | None = None  # the served model name; None: the role's model name
    api_key_env: str | None = None
    timeout_s: float | None = Field(None, gt=0)
    max_retries: int | None = Field(None, ge=0)
    max_concurrency: int | None = Field(None, ge=1)
    schema_name: str | None = None
    use_max_completion_tokens: bool | None = None
    extra_body: dict[str, Any] | None = None
    vllm_extensions: bool | None = None


# Each engine declares its own options; `name` picks the schema.
EngineCfg = Annotated[VLLMEngineCfg | ScriptedEngineCfg | OpenAIEngineCfg, Field(discriminator="name")]


class DatasetCfg(_Cfg):
    name: str
    path: str | None


class ShardCfg(_Cfg):
    index: int = Field(0, ge=0)
    count: int = Field(1, ge=1)


class TrialsCfg(_Cfg):
    """`trials`: each story played `count` times (docs/guide/trials.md). Trial 0 is the episode a run
    without trials plays; in the others the roles in `vary` draw new seeds, the rest keep trial 0's."""

    count: int = Field(1, ge=1)
    vary: str | list[str] = ALL  # `all`, or a list of roles, e.g. [auditor]; [] replays trial 0's seeds

    @field_validator("vary")
    @classmethod
    def _roles(cls, v: str | list[str]) -> str | list[str]:
        varied_roles(v)
        if isinstance(v, list) and len(set(v)) != len(v):
            raise ValueError(f"{v} names a role twice")
        return v

    @property
    def roles(self) -> frozenset[str]:
        """The roles whose calls draw trial-specific seeds."""
        return varied_roles(self.vary)


class ReportCfg(_Cfg):
    """`mode=report`: where to write and how to compute the intervals."""

    out: str | None = None  # null: <first run>/report
    resamples: int = Field(2000, ge=1)
    seed: int = 0
    level: float = Field(0.95, gt=0, lt=1)
    dataset: str | None = None  # null: the dataset path in each run's manifest
    html: bool = True
    # Row labels: null names each run by what differs between the compared runs' configs
    # (report/labels.py); a template names them explicitly, e.g. "{narrator.temperature}/{seed}".
    label: str | None = None
    # The price of one GPU-hour: the cost table then prices each stage's share of the engines' busy time.
    gpu_hour_cost: float | None = Field(None, ge=0)
    # mode=plan's prompt projection beside the measured tokens (plays the plan on each run's recorded config).
    plan: bool = False


class ExportCfg(_Cfg):
    """`mode=export`: the runs as logs another tool reads."""

    # inspect: Inspect's .eval log (inspect_ai, the `inspect` extra); parquet: the analysis tables;
    # reference: the official NCP-Bench result files, one folder per run
    format: Literal["inspect", "parquet", "reference"] = "inspect"
    out: str | None = None  # null: <first run>/<format> (a sweep folder: <folder>/<format>)
    # inspect: also every call as a model event (a 100-turn episode makes hundreds; Inspect's viewer
    # slows on very large logs); false leaves them out, the transcript and scores stay.
    events: bool = True


TRACKERS: tuple[str, ...] = ("none", "mlflow", "wandb")


class TrackerCfg(_Cfg):
    """`tracker=`: where a finished run is logged besides its run directory (ncp_local/tracking)."""

    name: Literal["none", "mlflow", "wandb"] = "none"  # none | mlflow | wandb (conf/tracker/)
    project: str = Field("ncp", min_length=1)  # the MLflow experiment / the W&B project
    # Where the tracker writes: MLflow's local file store, W&B's run files; null: ./mlruns, ./wandb.
    dir: str | None = None
    uri: str | None = None  # MLflow: a tracking server or database URI instead of the file store
    mode: Literal["offline", "online"] = "offline"  # W&B: offline writes run files only (`wandb sync` later)
    entity: str | None = None  # W&B: the team or user the project belongs to (online)
    # The most the tracker may take once the run has finished; past it the run exits without it.
    timeout_s: float = Field(300.0, gt=0)
    report: bool = True  # also log the run's report folder (tables, S(t) plot, cost) as an artifact


class ReviewCfg(_Cfg):
    """`mode=review`: export a sample of conflict terminations, or read a filled sheet back."""

    n: int = Field(20, ge=1)
    seed: int = 0
    out: str | None = None  # null: <first run>/review
    sheet: str | None = None  # a filled review CSV: report its disputed rate


class AuditCfg(_Cfg):
    """What the auditor is asked besides PROTOCOL section 3's steps."""

    # One more auditor call on a turn whose conflicts stand: each conflict's failure mode
    # (stages.FAILURE_MODES), in the turn record; mode=reaudit asks it over a finished run.
    failure_modes: bool = False

    @property
    def templates(self) -> tuple[str, ...]:
        """The optional stages' templates these settings ask (protocol.prompts.OPTIONAL)."""
        return ("failure_mode",) if self.failure_modes else ()


class BenchCfg(_Cfg):
    episodes: int = Field(16, ge=1)
    turns: int = Field(4, ge=1)
    throughput: float | None = Field(None, gt=0)  # tokens/s per GPU for the cost projection
    sequential: bool = True
    # The sequential way on the first N episodes only (its tokens/s is what is compared); null = all.
    sequential_episodes: int | None = Field(None, ge=1)
    # A sweep to bench instead: {config key: [values]}, its points run batched (one engine) and
    # point by point (an engine each), e.g. {narrator.temperature: [0.2, 0.6], seed: [0, 1]}.
    sweep: dict[str, list[Any]] | None = None
    # The long-horizon bench (modes/benches/long_horizon.py): `episodes` played to `at_turn` on scripted answers,
    # then `turns` more on the engine, whose KV cache holds `kv_tokens` (null: as planned), at each of
    # `levels` episodes in flight and with admission by cache capacity.
    long_horizon: bool = False
    at_turn: int = Field(12, ge=1)
    kv_tokens: int | None = Field(None, ge=1)
    levels: list[PositiveInt] = Field([1, 2, 4, 8], min_length=1)
    # The next turn's player asked after the audits and during them: turn latency both ways, on the
    # first `speculative_episodes` episodes x `turns` (before the long-horizon bench, if both are on).
    speculative: bool = False
    speculative_episodes: int = Field(2, ge=1)


class PlanCfg(_Cfg):
    """`mode=plan` and the checks `mode=run` makes first (ncp_local/plan)."""

    gpus: list[str] | None = None  # e.g. [H100-80GB, H100-80GB]; null: nvidia-smi, else this CPU
    max_device_share: float = Field(0.9, gt=0, le=1)  # the most all shares on one GPU may add up to
    overhead_gib: float = Field(3.0, ge=0)  # per engine and GPU beyond weights and KV (activations, graphs)
    cpu_share: float = Field(0.3, gt=0, le=1)  # RAM share for KV caches on a CPU, split among planned engines
    # The prompt projection: turns played on the longest specs with scripted answers of these sizes.
    fit_specs: int = Field(3, ge=1)
    fit_turns: int = Field(4, ge=2)
    narration_words: int = Field(150, ge=1)
    player_words: int = Field(50, ge=1)
    reason_words: int = Field(20, ge=1)
    facts_per_turn: int = Field(1, ge=0)
    at_turns: list[int] = [0, 1, 10, 25, 50]  # table columns, besides max_turns
    measured: str | None = None  # a run directory: fit its calls.jsonl instead of playing


class RunConfig(_Cfg):
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
    export: ExportCfg = ExportCfg()
    tracker: TrackerCfg = TrackerCfg()
    submission: str | None = None  # mode=submission: the archive to write; mode=validate: the archive to check
    review: ReviewCfg = ReviewCfg()
    audit: AuditCfg = AuditCfg()
    plan: PlanCfg = PlanCfg()
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
        return RunConfig.model_validate(raw)
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
        if err["type"] == "value_error":  # our own validators: the message names what is wrong
            raise ConfigError(field, err["msg"].removeprefix("Value error, ")) from None
        raise ConfigError(field, f"{err['msg']} (got {shown(err.get('input'))})") from None


def dataset_path(cfg: RunConfig) -> Path:
    if not cfg.dataset.path:
        raise ConfigError(
            "dataset.path", f"not set for dataset {cfg.dataset.name!r} (pass dataset.path=DIR or set NCP_BENCH_DATASET)"
        )
    return Path(cfg.dataset.path).expanduser()


def compose(overrides: list[str], config_name: str = "config", hydra_config: bool = False) -> Any:
    """The config `run.py` would get for these overrides, outside `hydra.main`.

    Used to check overrides up front and by the Slurm submitter to name the
    run directory once. Raises Hydra's own exceptions (see `hydra_error_line`).
    """
    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT), replace=True)
    # Inside a running Hydra app (a mode composing its sweep's points, mode=bench) Hydra refuses a
    # second initialisation: step aside from the app's Hydra and put it back after.
    running = get_gh_backup() if GlobalHydra.instance().is_initialized() else None
    if running is not None:
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            return hydra_compose(config_name, overrides=overrides, return_hydra_config=hydra_config)
    finally:
        if running is not None:
            restore_gh_from_backup(running)


def bounded(line: str, limit: int = 500) -> str:
    """An error line cut to `limit` characters (Hydra quotes a whole override, which can be long)."""
    return line if len(line) <= limit else line[: limit - 3] + "..."


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
