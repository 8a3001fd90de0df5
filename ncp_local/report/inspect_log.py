"""A finished run as an Inspect evaluation log (`.eval`), built with inspect_ai's own classes.

Inspect (UK AISI's inspect_ai) keeps one log per evaluation: the task, its dataset and
config, the models (here one per role, as Inspect's model roles), and one sample per
dataset item. Here a sample is an episode:

- `messages`: the transcript as people read it: the opening and each narration as the
  assistant's, each player input as the user's (metadata names the role and `turn_id`);
- `events` (unless `export.events=false`): every line of the run's call log, in order, as a model event carrying its
  role, stage, turn, attempt and seed, its token usage and time in the engine, grouped
  in one span per turn. The call log keeps no prompts, so an event's input is empty; its
  output is the failed attempt's raw text when the attempt failed, and for an accepted
  answer the value the episode record keeps (narration, player input, auditor payloads);
- `scores`: the record's termination, turns, trajectory and satisfied shares and conflict
  types (PROTOCOL section 5, `protocol/metrics.py`);
- token usage per model and per role, for the sample and the whole log.

The file format is versioned but no frozen spec (its maintainers say so), so it is only
ever written through the pinned library's `write_eval_log` (the `inspect` extra).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..bindings import ran_no_model, recorded_engine
from ..config import ConfigError
from ..protocol import ROLES
from ..protocol.metrics import ENDING_CENSORED, EpisodeMetrics, aggregate, episode_metrics
from ..protocol.records import EpisodeResult
from ..protocol.stages import CONFLICT_TYPES
from ..protocol.trials import episode_name
from ..protocol.turns import OPENING
from ..protocol.turns import shown as shown_turn
from ..resources import install_hint
from ..rundir.call_log import CallLine
from .cost import run_calls
from .runs import Run

TASK = "ncp"
NO_MODEL = "no-model"  # what a scripted run's roles are named: no model ran
INSTALL = f"{install_hint('inspect')} (inspect_ai, pinned in pyproject.toml)"
# Inspect's stop reasons for the engine's finish reasons.
STOP = {"stop": "stop", "length": "max_tokens", "context_overflow": "model_length"}
SCORES = ("termination", "turns", "trajectory", "satisfied", "conflict")


def model_name(run: Run, role: str) -> str:
    """Inspect's `provider/model` for a role: the engine that served it and its model; a scripted run
    is `scripted/no-model` whatever its config names."""
    cfg = run.manifest.get("config") or {}
    engine = recorded_engine(cfg, role) or "unknown"
    if ran_no_model(cfg, role):
        return f"{engine}/{NO_MODEL}"
    name = (
        ((cfg.get(role) or {}).get("model") or {}).get("name")
        or ((run.manifest.get("models") or {}).get(role) or {}).get("name")
        or "unknown"
    )
    return f"{engine}/{name}"


def conflict_label(m: EpisodeMetrics) -> str:
    return ", ".join(t for t in CONFLICT_TYPES if getattr(m, t)) or "none"


def score_values(m: EpisodeMetrics) -> dict[str, Any]:
    """The episode's scores as its record gives them (the names are `SCORES`)."""
    return {
        "termination": m.termination,
        "turns": m.turns,
        "trajectory": m.trajectory_progress,
        "satisfied": m.satisfied,
        "conflict": conflict_label(m),
    }


def _when(seconds: float | None) -> dt.datetime | None:
    return None if seconds is None else dt.datetime.fromtimestamp(float(seconds), dt.UTC)


def _created(run: Run) -> str:
    created = run.manifest.get("created")
    return str(created) if created else dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def accepted_output(result: EpisodeResult, stage: str, turn: int) -> str | None:
    """What the episode record keeps of the accepted answer of `stage` at `turn` (None: nothing)."""
    if turn < 0:
        if stage == "opening":
            return result.opening
        if stage == "fact_update" and result.opening_update is not None:
            return result.opening_update.model_dump_json()
        return None
    rec = next((t for t in result.turns if t.turn == turn), None)
    if rec is None:
        return None
    answers: dict[str, str | BaseModel | tuple[BaseModel, ...] | None] = {
        "player": rec.player_input,
        "narrate": rec.response,
        "fact_update": rec.fact_update,
        "conflict_check": rec.conflict_check,
        "double_check": rec.double_check,
        "trajectory_check": rec.trajectory_check,
        "status_check": rec.status_check,
    }
    payload = answers.get(stage)
    if payload is None or isinstance(payload, str):
        return payload
    if isinstance(payload, tuple):
        return json.dumps([p.model_dump(mode="json") for p in payload], ensure_ascii=False)
    return json.dumps(payload.model_dump(mode="json"), ensure_ascii=False)


def _turn_label(turn: int) -> str:
    # Records keep the reference's turn_id; people read the paper's count (protocol/turns.py).
    # The viewer shows a span as "TYPE: NAME", so "turn: 1", "turn: opening".
    return "opening" if turn <= OPENING else str(shown_turn(turn))


def build_log(run: Run, events: bool = True) -> Any:
    """The run as an `inspect_ai.log.EvalLog`; `events=False` leaves the per-call model events out (the
    messages, scores and token usage stay): Inspect's viewer struggles with very large logs."""
    try:
        from inspect_ai.event import ModelEvent, SpanBeginEvent, SpanEndEvent
        from inspect_ai.log import (
            EvalConfig,
            EvalDataset,
            EvalLog,
            EvalMetric,
            EvalPlan,
            EvalPlanStep,
            EvalResults,
            EvalRevision,
            EvalSample,
            EvalScore,
            EvalSpec,
            EvalStats,
        )
        from inspect_ai.model import (
            ChatCompletionChoice,
            ChatMessageAssistant,
            ChatMessageUser,
            GenerateConfig,
            ModelConfig,
            ModelOutput,
            ModelUsage,
        )
        from inspect_ai.scorer import Score
    except ImportError as exc:
        raise ConfigError(
            "export.format", f"inspect needs inspect_ai, which is not installed ({exc.name}): {INSTALL}"
        ) from None

    cfg = run.manifest.get("config") or {}
    role_models = {r: model_name(run, r) for r in ROLES}

    def sampling(role: str) -> Any:
        rc = cfg.get(role) or {}
        return GenerateConfig(temperature=rc.get("temperature"), top_p=rc.get("top_p"), max_tokens=rc.get("max_tokens"))

    def usage(calls: Iterable[CallLine]) -> Any:
        out = ModelUsage()
        for c in calls:
            prompt, cached = c.prompt_tokens or 0, c.cached_tokens or 0
            gen = c.generated_tokens or 0
            out = out + ModelUsage(
                input_tokens=prompt - cached,
                input_tokens_cache_read=cached,
                output_tokens=gen,
                total_tokens=prompt + gen,
            )
        return out

    def usage_by(calls: list[CallLine], key: str) -> dict[str, Any]:
        names: Callable[[CallLine], str] = {
            "model": lambda c: role_models.get(c.role, f"unknown/{c.model}"),
            "role": lambda c: c.role,
        }[key]
        groups: dict[str, list[CallLine]] = {}
        for c in calls:
            groups.setdefault(names(c), []).append(c)
        return {k: usage(v) for k, v in sorted(groups.items())}

    all_calls = run_calls(run)
    by_episode: dict[str, list[CallLine]] = {}
    for c in all_calls:
        by_episode.setdefault(episode_name(c.spec_id, c.trial), []).append(c)

    def event(c: CallLine, result: EpisodeResult, span: str, t0: float) -> Any:
        role, stage, turn = c.role, c.stage, c.turn
        model = role_models.get(role, f"unknown/{c.model}")
        error = c.error
        text = (c.output or "") if error else (accepted_output(result, stage, turn) or "")
        choice = ChatCompletionChoice(
            message=ChatMessageAssistant(content=text, source="generate", model=model),
            stop_reason=STOP.get(str(c.finish_reason), "unknown"),
        )
        done = c.done_at
        latency = c.latency_s or 0.0
        extra = (
            {}
            if done is None
            else {
                "timestamp": _when(done),
                "completed": _when(done),
                "working_start": max(0.0, done - latency - t0),
            }
        )
        return ModelEvent(
            model=model,
            role=role,
            input=[],
            tools=[],
            tool_choice="none",
            config=GenerateConfig(
                temperature=sampling(role).temperature,
                top_p=sampling(role).top_p,
                max_tokens=sampling(role).max_tokens,
                seed=c.seed,
            ),
            output=ModelOutput(model=model, choices=[choice], completion=text, usage=usage([c]), time=latency),
            error=error,
            working_time=latency,
            span_id=span,
            metadata={
                "stage": stage,
                "role": role,
                "turn_id": turn,
                "attempt": c.attempt,
                "seed": c.seed,
                "finish_reason": c.finish_reason,
                "key": c.key or None,
                "output_from": "call log (failed attempt)" if error else "episode record (accepted answer)",
            },
            **extra,
        )

    samples = []
    for sid, result in run.results.items():
        m = episode_metrics(result)
        calls = by_episode.get(sid, [])  # sid: the episode's name; a story's trials are its epochs
        spec = run.specs.get(result.spec_id)
        messages: list[Any] = [
            ChatMessageAssistant(
                content=result.opening,
                source="generate",
                model=role_models["narrator"],
                metadata={"role": "narrator", "stage": "opening", "turn_id": -1},
            )
        ]
        for rec in result.turns:
            messages.append(
                ChatMessageUser(
                    content=rec.player_input, source="generate", metadata={"role": "player", "turn_id": rec.turn}
                )
            )
            messages.append(
                ChatMessageAssistant(
                    content=rec.response,
                    source="generate",
                    model=role_models["narrator"],
                    metadata={"role": "narrator", "turn_id": rec.turn},
                )
            )
        starts = [c.done_at - (c.latency_s or 0.0) for c in calls if c.done_at is not None]
        t0 = min(starts) if starts else 0.0
        sample_events: list[Any] = []
        open_span: str | None = None
        for c in calls if events else ():
            span = f"{sid}/{_turn_label(c.turn)}"
            if span != open_span:
                if open_span is not None:
                    sample_events.append(SpanEndEvent(id=open_span, span_id=open_span))
                sample_events.append(SpanBeginEvent(id=span, name=_turn_label(c.turn), type="turn", span_id=span))
                open_span = span
            sample_events.append(event(c, result, span, t0))
        if open_span is not None:
            sample_events.append(SpanEndEvent(id=open_span, span_id=open_span))
        ends = [c.done_at for c in calls if c.done_at is not None]
        title = spec.meta.title if spec else result.spec_id
        samples.append(
            EvalSample(
                id=result.spec_id,
                epoch=result.trial + 1,  # Inspect counts epochs from 1
                target="",
                input=(f"{title}; the player is {spec.meta.player_role}" if spec else result.spec_id),
                messages=messages,
                output=ModelOutput.from_content(
                    role_models["narrator"], result.turns[-1].response if result.turns else result.opening
                ),
                scores={
                    name: Score(value=value, explanation=(result.reason or None) if name == "termination" else None)
                    for name, value in score_values(m).items()
                },
                metadata={
                    "spec_id": result.spec_id,
                    "title": title,
                    "genres": list(spec.meta.genres) if spec else [],
                    "termination_reason": result.reason,
                    "censored": m.termination in ENDING_CENSORED,
                    "max_turns": result.max_turns,
                    "bound_hits": m.bound_hits,
                },
                events=sample_events,
                model_usage=usage_by(calls, "model"),
                role_usage=usage_by(calls, "role"),
                started_at=_when(min(starts)) if starts else None,
                completed_at=_when(max(ends)) if ends else None,
                total_time=(max(ends) - min(starts)) if starts and ends else None,
                working_time=sum(c.latency_s or 0.0 for c in calls),
            )
        )

    agg = aggregate(run.metrics(), run.max_turns)

    def metric(name: str, value: float) -> Any:
        return EvalMetric(name=name, value=value)

    results = EvalResults(
        total_samples=len(samples),
        completed_samples=agg.scored,
        scores=[
            EvalScore(
                name="termination",
                scorer="termination",
                scored_samples=agg.episodes,
                metrics={k: metric(k, n) for k, n in agg.terminations.items()},
            ),
            EvalScore(
                name="turns", scorer="turns", scored_samples=agg.scored, metrics={"mean": metric("mean", agg.avg_turns)}
            ),
            EvalScore(
                name="trajectory",
                scorer="trajectory",
                scored_samples=agg.scored,
                metrics={"mean": metric("mean", agg.trajectory_pct / 100)},
            ),
            EvalScore(
                name="satisfied",
                scorer="satisfied",
                scored_samples=agg.scored,
                metrics={"mean": metric("mean", agg.satisfied_pct / 100)},
            ),
            EvalScore(
                name="conflict",
                scorer="conflict",
                scored_samples=agg.scored,
                metrics={
                    "conflict_free": metric("conflict_free", agg.conflict_free),
                    **{t: metric(t, getattr(agg, f"{t}_pct") / 100) for t in CONFLICT_TYPES},
                },
            ),
        ],
    )
    dataset = run.manifest.get("dataset") or {}
    git = run.manifest.get("git") or {}
    commit = str(git.get("revision") or run.manifest.get("git_revision") or "")
    spec = EvalSpec(
        eval_id=str(run.manifest.get("identity") or run.key),
        run_id=str(run.manifest.get("identity") or run.key),
        created=_created(run),
        task=TASK,
        task_id=str(run.manifest.get("identity") or ""),
        task_version=str(run.manifest.get("rig_version") or "0"),
        task_display_name=f"NCP: {run.label}",
        task_args={
            "condition": (cfg.get("condition") or {}).get("name"),
            "method": (cfg.get("method") or {}).get("name"),
            "max_turns": cfg.get("max_turns"),
            "seed": cfg.get("seed"),
        },
        dataset=EvalDataset(
            name=(cfg.get("dataset") or {}).get("name"),
            location=dataset.get("path"),
            samples=len({r.spec_id for r in run.results.values()}),
            sample_ids=list(dict.fromkeys(r.spec_id for r in run.results.values())),
        ),
        model=role_models["narrator"],
        model_generate_config=sampling("narrator"),
        model_roles={r: ModelConfig(model=role_models[r], config=sampling(r)) for r in ROLES},
        config=EvalConfig(
            limit=cfg.get("limit"),
            epochs=1 + max((r.trial for r in run.results.values()), default=0),
            max_samples=cfg.get("concurrency"),
        ),
        revision=EvalRevision(type="git", origin="", commit=commit, dirty=git.get("dirty")) if commit else None,
        packages={k: str(v) for k, v in (run.manifest.get("versions") or {}).items()},
        metadata={
            "ncp_local": {
                "run_dir": str(run.path),
                "identity": run.manifest.get("identity"),
                "label": run.label,
                "dataset_sha256": dataset.get("sha256"),
                "turn_ids": "records keep the reference's turn_id: the opening is -1, the first "
                "player turn 0; spans and labels count from turn 1",
            }
        },
    )
    starts = [s.started_at for s in samples if s.started_at]
    ends = [s.completed_at for s in samples if s.completed_at]
    stats = EvalStats(
        started_at=min(starts) if starts else "",
        completed_at=max(ends) if ends else "",
        model_usage=usage_by(all_calls, "model"),
        role_usage=usage_by(all_calls, "role"),
    )
    return EvalLog(
        status="success" if not run.unfinished else "started",
        eval=spec,
        plan=EvalPlan(
            name="ncp",
            steps=[
                EvalPlanStep(
                    solver="ncp_episode",
                    params={
                        "narrator": role_models["narrator"],
                        "player": role_models["player"],
                        "auditor": role_models["auditor"],
                    },
                )
            ],
            config=sampling("narrator"),
        ),
        results=results,
        stats=stats,
        samples=samples,
    )


def write_log(log: Any, run: Run, out: Path) -> Path:
    """The run's log (`build_log`) as one `.eval` file in `out`, through inspect_ai's `write_eval_log`."""
    from inspect_ai.log import write_eval_log

    created = log.eval.created if isinstance(log.eval.created, str) else log.eval.created.isoformat()
    path = out / f"{created.replace(':', '-')}_{TASK}_{run.key}.eval"
    write_eval_log(log, str(path))
    return path
