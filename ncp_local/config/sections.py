"""The config's sections as typed records: a role, its endpoint, each engine's options, and the settings
of each mode (report, export, tracker, review, audit, bench, plan). `schema.RunConfig` assembles them."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from ..engines.registry import KINDS
from ..engines.settings import ModelSettings
from ..protocol.stages import CONFLICT_TYPES, Bounds
from ..protocol.trials import ALL, varied_roles

SCRIPTED = "scripted"  # the engine name, and the label of whatever it "played"


class ConfigModel(BaseModel):
    """Every config record: closed to unknown keys and strict about types."""

    # Unknown keys are refused (`+narrator.temprature=0.1` must not pass), and
    # strict: `max_turns=true` is not 1, `progress=1` is not true (ints still
    # pass where a float is expected).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# The engine kinds (engines/registry.py); the Literal lets the config name them, and must agree.
EngineName = Literal["vllm", "scripted", "openai"]
ENGINES: tuple[str, ...] = tuple(KINDS)
assert set(get_args(EngineName)) == set(ENGINES), "config.EngineName and engines/registry.py disagree"


class EndpointCfg(ConfigModel):
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


class RoleCfg(ConfigModel):
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


class VLLMEngineCfg(ConfigModel):
    """`engine=vllm`: in-process engines, one per distinct model (conf/engine/vllm.yaml)."""

    name: Literal["vllm"]
    deterministic: bool = False  # every GPU engine batch-invariant (see ModelSettings.deterministic)


class ScriptedEngineCfg(ConfigModel):
    """`engine=scripted`: seeded schema-valid answers (engines/scripted.py RandomPolicy)."""

    name: Literal["scripted"]
    conflict_rate: float = Field(0.1, ge=0, le=1)
    overturn_rate: float = Field(0.3, ge=0, le=1)
    node_rate: float = Field(0.35, ge=0, le=1)
    satisfy_rate: float = Field(0.25, ge=0, le=1)
    delay_s: float = Field(0.0, ge=0)  # simulated latency per call
    # Text lengths in characters (0: the short scripted texts): a narration, a player's line, an
    # auditor's reason. A real narrator's and player's: about 900, 300 and 120 (mode=bench's rig-alone way).
    narration_chars: int = Field(0, ge=0)
    player_chars: int = Field(0, ge=0)
    reason_chars: int = Field(0, ge=0)
    die_after_calls: int | None = Field(None, ge=0)  # fault injection: EngineDead from this call on
    # Fault injection: from this player turn on, a chosen share of the episodes no longer fit the
    # window (their calls raise ContextOverflow), so they end `context_limit`, censored.
    context_limit_turn: int | None = Field(None, ge=1)
    context_limit_share: float = Field(1.0, ge=0, le=1)
    # mode=plant's known auditor (engines/scripted.py PlantJudge): the share of planted contradictions it
    # finds, of clean items it flags, and of the plants it finds that it names with another id than the
    # planted one, per conflict type (one number: every type).
    plant_recall: dict[str, float] = Field(default_factory=lambda: dict.fromkeys(CONFLICT_TYPES, 0.8))
    plant_false_alarm: dict[str, float] = Field(default_factory=lambda: dict.fromkeys(CONFLICT_TYPES, 0.05))
    plant_wrong_id: dict[str, float] = Field(default_factory=lambda: dict.fromkeys(CONFLICT_TYPES, 0.0))

    @field_validator("plant_recall", "plant_false_alarm", "plant_wrong_id", mode="before")
    @classmethod
    def _per_type(cls, v: Any) -> Any:
        if isinstance(v, int | float) and not isinstance(v, bool):
            v = dict.fromkeys(CONFLICT_TYPES, float(v))
        if isinstance(v, dict):
            extra = sorted(str(k) for k in v if k not in CONFLICT_TYPES)
            if extra:
                raise ValueError(f"{extra[0]!r} is not a conflict type (one of {', '.join(CONFLICT_TYPES)})")
            bad = [k for k, x in v.items() if isinstance(x, bool) or not isinstance(x, int | float) or not 0 <= x <= 1]
            if bad:
                raise ValueError(f"{bad[0]}: a share from 0 to 1, got {v[bad[0]]!r}")
            return {**dict.fromkeys(CONFLICT_TYPES, 0.0), **{k: float(x) for k, x in v.items()}}
        return v


class OpenAIEngineCfg(ConfigModel):
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


class DatasetCfg(ConfigModel):
    name: str
    path: str | None


class ShardCfg(ConfigModel):
    index: int = Field(0, ge=0)
    count: int = Field(1, ge=1)


class TrialsCfg(ConfigModel):
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


class ReportCfg(ConfigModel):
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
    # The restricted mean's ("turns kept") horizon in turns: null is each run's turn cap (max_turns).
    horizon: int | None = Field(None, ge=1)


class CompareCfg(ConfigModel):
    """`mode=compare` (and the comparisons section of `mode=report`): the paper's figures beside a run."""

    # A row of the paper's published figures (report/paper_figures.yaml), e.g. "table1/GPT-4o-mini";
    # null: the row whose narrator, method and input match the run, when one does.
    paper: str | None = None


class StatusCfg(ConfigModel):
    """The heartbeat every running process writes (execution/heartbeat.py; its format: rundir/heartbeat.py)
    and `mode=status`, which reads it."""

    # Finite numbers only (inf would never beat, never redraw, never stall).
    model_config = ConfigDict(allow_inf_nan=False)
    # How often a running process rewrites its status.json; 0: never (mode=status then knows less); else
    # 0.5 s to a day (faster is a disk's work for nothing, slower is no heartbeat).
    heartbeat_s: float = Field(5.0, ge=0, le=86_400)
    # "Stalled": no committed turn and no completed call for longer than this; null derives it from the
    # run's own turns: max(stall_floor_s, stall_factor x the 90th percentile of its recent turn durations).
    stall_s: float | None = Field(None, gt=0)
    stall_factor: float = Field(5.0, gt=0)
    stall_floor_s: float = Field(120.0, gt=0)
    # mode=status: redraw every N seconds (a terminal) until interrupted, at least 0.5 s; null: once.
    watch: float | None = Field(None, ge=0.5, le=86_400)
    format: Literal["table", "json"] = "table"

    @field_validator("heartbeat_s")
    @classmethod
    def _off_or_a_pace(cls, v: float) -> float:
        if 0 < v < 0.5:
            raise ValueError("must be 0 (no heartbeat) or at least 0.5 seconds")
        return v


class ExportCfg(ConfigModel):
    """`mode=export`: the runs as logs another tool reads."""

    # inspect: Inspect's .eval log (inspect_ai, the `inspect` extra); parquet: the analysis tables;
    # reference: the official NCP-Bench result files, one folder per run
    format: Literal["inspect", "parquet", "reference"] = "inspect"
    out: str | None = None  # null: <first run>/<format> (a sweep folder: <folder>/<format>)
    # inspect: also every call as a model event (a 100-turn episode makes hundreds; Inspect's viewer
    # slows on very large logs); false leaves them out, the transcript and scores stay.
    events: bool = True


TRACKERS: tuple[str, ...] = ("none", "mlflow", "wandb")


class TrackerCfg(ConfigModel):
    """`tracker=`: where a finished run is logged besides its run directory (ncp_local/tracking)."""

    name: Literal["none", "mlflow", "wandb"] = "none"  # none | mlflow | wandb (conf/tracker/)
    project: str = Field("ncp", min_length=1)  # the MLflow experiment / the W&B project
    # Where the tracker writes: MLflow's SQLite store (DIR/mlflow.db, artifacts in DIR/mlruns), W&B's run
    # files; null: the working folder (./mlflow.db: MLflow 3's own default store), ./wandb.
    dir: str | None = None
    uri: str | None = None  # MLflow: a tracking server or another database URI instead of DIR/mlflow.db
    mode: Literal["offline", "online"] = "offline"  # W&B: offline writes run files only (`wandb sync` later)
    entity: str | None = None  # W&B: the team or user the project belongs to (online)
    # The most the tracker may take once the run has finished; past it the run exits without it.
    timeout_s: float = Field(300.0, gt=0)
    report: bool = True  # also log the run's report folder (tables, S(t) plot, cost) as an artifact


class ReviewCfg(ConfigModel):
    """`mode=review`: export a sample of conflict terminations, or read a filled sheet back."""

    n: int = Field(20, ge=1)
    seed: int = 0
    out: str | None = None  # null: <first run>/review
    sheet: str | None = None  # a filled review CSV: report its disputed rate


class PlantCfg(ConfigModel):
    """mode=plant: contradictions planted into a finished run's clean turns (protocol/plant.py)."""

    turns: PositiveInt = 2  # clean turns drawn per episode (all it has, when fewer)
    types: list[str] = Field(default_factory=lambda: list(CONFLICT_TYPES))  # one planted item per type
    place: Literal["start", "end", "random"] = "end"  # where the planted sentence goes in the narration
    seed: int = 0  # the draw of turns, targets and places
    # A planting model: `narrator`, the narrator as configured (narrator=<group>, its engine and sampling),
    # rewrites each planted turn with its contradiction, checked (protocol/plant.py rewrite_item); a rewrite
    # that fails the check is replaced by the fixed edit. None: the fixed edits alone.
    model: Literal["narrator"] | None = None

    @property
    def templates(self) -> tuple[str, ...]:
        """The optional stages' templates these settings ask (protocol.prompts.OPTIONAL)."""
        return ("plant_rewrite",) if self.model else ()

    @field_validator("types")
    @classmethod
    def _types(cls, v: list[str]) -> list[str]:
        unknown = [t for t in v if t not in CONFLICT_TYPES]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not a conflict type (one of {', '.join(CONFLICT_TYPES)})")
        if not v:
            raise ValueError("plant at least one conflict type")
        return list(dict.fromkeys(v))


class AuditCfg(ConfigModel):
    """What the auditor is asked besides PROTOCOL section 3's steps."""

    # One more auditor call on a turn whose conflicts stand: each conflict's failure mode
    # (stages.FAILURE_MODES), in the turn record; mode=reaudit asks it over a finished run.
    failure_modes: bool = False

    @property
    def templates(self) -> tuple[str, ...]:
        """The optional stages' templates these settings ask (protocol.prompts.OPTIONAL)."""
        return ("failure_mode",) if self.failure_modes else ()


class BenchCfg(ConfigModel):
    episodes: int = Field(16, ge=1)
    turns: int = Field(4, ge=1)
    throughput: float | None = Field(None, gt=0)  # tokens/s per GPU for the cost projection
    sequential: bool = True
    # The sequential way on the first N episodes only (its tokens/s is what is compared); null = all.
    sequential_episodes: int | None = Field(None, ge=1)
    # A sweep to bench instead: {config key: [values]}, its points run batched (one engine) and
    # point by point (an engine each), e.g. {narrator.temperature: [0.2, 0.6], seed: [0, 1]}.
    sweep: dict[str, list[Any]] | None = None
    # The long-horizon bench (ncp_local/bench/long_horizon.py): `episodes` played to `at_turn` on scripted answers,
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
    # The rig alone at paper length (ncp_local/bench/rig_alone.py): `episodes` stories x `trials`, `turns`
    # turns each, on the scripted engine with texts as long as real ones (unless `short_texts`), every
    # episode in flight; `fsync_delay_s`: a slow filesystem; `profile`: under cProfile, its top costs.
    rig_alone: bool = False
    trials: int = Field(1, ge=1)
    short_texts: bool = False
    fsync_delay_s: float = Field(0.0, ge=0)
    profile: bool = False
    keep_run: bool = False  # keep the played run directory (bench dir/rig-alone-run)


class PlanCfg(ConfigModel):
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
