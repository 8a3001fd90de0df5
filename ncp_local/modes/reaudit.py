"""Re-audit a finished run with another auditor, without new narration.

Every recorded turn is judged again by the configured auditor with the
stages a turn uses (fact_update -> conflict_check -> double_check when the
first check finds conflicts), through the call service (`CallService.ask`), so retries, per-call
seeds and the call log work as in a run. The state each turn is judged
against is the one the original episode had before that turn, rebuilt by
replaying the recorded decisions through `ledger` (report.replay): only the
judgement of the turn changes, never the story or the state it was told in.

Because every turn's state is known in advance, all turns of all episodes
are independent requests and go to the engine at once.

Output: a run dir of its own (manifest with `kind: reaudit`, results/<spec>.json
per episode, calls.jsonl) plus agreement.{md,json} and per-turn / per-episode
CSVs: Cohen's kappa on conflict yes/no per turn, per-type confusion, and
Pearson / Spearman of per-episode metrics between the two auditors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..config import ConfigError, RunConfig
from ..errors import InputError
from ..execution.calls import CallService
from ..execution.failures import Exit
from ..execution.preflight import preflight
from ..execution.rejudge import auditor_pool, each_episode, judge_run
from ..protocol.prompts import TEMPLATES, PromptPack
from ..protocol.reaudit import ReauditResult, TurnAudit, audit_turn
from ..protocol.records import EpisodeResult
from ..protocol.replay import TurnView, replay
from ..protocol.spec import Spec
from ..report import run_notes
from ..report.agreement import agreement, write_agreement
from ..report.auditors import main as table_main
from ..report.failure_modes import reaudit_modes, write_modes
from ..report.runs import REAUDIT_KIND, Run, attach_specs, expand_runs, load_run
from ..rundir import identity as identity_mod
from ..rundir import provenance
from ..rundir.layout import require_finished
from ..rundir.store import RunDir


async def reaudit_episode(
    spec: Spec, result: EpisodeResult, calls: CallService, gate: asyncio.Semaphore, failure_modes: bool = False
) -> ReauditResult:
    rp = replay(spec, result)

    async def one(view: TurnView) -> TurnAudit:
        async def ask(stage: str, template: str, variables: dict[str, str], **kw: Any) -> Any:
            return await calls.ask(result.episode, view.record.turn, stage, template, variables, **kw)

        async with gate:
            return await audit_turn(spec, view, ask, failure_modes)

    audits = await asyncio.gather(*(one(v) for v in rp.turns))
    return ReauditResult(
        spec_id=spec.id, source_termination=result.termination, turns=tuple(audits), trial=result.trial
    )


async def reaudit_all(
    items: Sequence[tuple[Spec, EpisodeResult]],
    calls: CallService,
    concurrency: int,
    on_result: Callable[[ReauditResult], None] | None = None,
    failure_modes: bool = False,
) -> dict[str, ReauditResult]:
    gate = asyncio.Semaphore(max(1, concurrency))
    by_name = {r.episode: (spec, r) for spec, r in items}

    async def episode(name: str) -> ReauditResult:
        return await reaudit_episode(*by_name[name], calls, gate, failure_modes)

    return await each_episode(by_name, episode, on_result)


# ---- mode=reaudit -----------------------------------------------------------------


def _identity(cfg: RunConfig, pack: PromptPack, source: Run) -> identity_mod.Identity:
    # Tied to the source run's identity (its path when it has none), so a re-audit
    # never shares an identity with a run or with a re-audit of another run.
    src = source.manifest.get("identity") or str(source.path.resolve())
    return identity_mod.of_reaudit(cfg, pack.templates, f"{REAUDIT_KIND}/{src}")


def auditor_table(cfg: RunConfig, paths: Sequence[str]) -> int:
    """Several auditors of the same episodes (re-audits of one run, with or without the run itself, or runs
    that differ in their auditor): the paper's Table 2 (report/auditors.py). No model is loaded."""
    out = Path(cfg.report.out).expanduser() if cfg.report.out else None
    return table_main(paths, out, cfg.report.resamples, cfg.report.seed, cfg.report.level)


def out_dir(cfg: RunConfig, source: Run, pack: PromptPack) -> tuple[Path, identity_mod.Identity]:
    """The re-audit's directory (`out_dir`, else reaudit-<source>-<identity> beside the source run, so
    where it lands does not depend on the directory the command was started from) and its identity."""
    ident = _identity(cfg, pack, source)
    beside = source.path.resolve().parent  # load_run has expanded `~` already
    out = Path(cfg.out_dir).expanduser() if cfg.out_dir else beside / f"reaudit-{source.key}-{ident.key}"
    return out, ident


def point_dir(cfg: RunConfig) -> Path:
    """Where `mode=reaudit` with this config writes (a sweep's index names it)."""
    source = load_run(cfg.runs[0])
    return out_dir(cfg, source, PromptPack.load(cfg.prompts.get("dir"), (*TEMPLATES, *cfg.optional_templates)))[0]


def main(cfg: RunConfig) -> int:
    require_finished(cfg.runs)
    runs = expand_runs(list(cfg.runs)) if cfg.runs else []
    if len(runs) > 1:
        return auditor_table(cfg, runs)
    if len(runs) != 1:
        raise ConfigError(
            "runs",
            "reaudit takes one run directory to judge again (runs=[DIR]), or several "
            "re-audits / runs for the auditor table (runs=[A,B,...] or a sweep folder)",
        )
    source = load_run(runs[0])
    if source.damaged:
        # Judging the rest would give agreement over other episodes than the run's own report
        # counts, in a re-audit marked DONE: refused, as a run with no finished episode is.
        path, why = source.damaged[0]
        more = f" (and {len(source.damaged) - 1} more file(s))" if len(source.damaged) > 1 else ""
        raise InputError(
            path,
            "runs",
            f"{why}{more}: its episode would be left out of the re-audit; re-run the "
            "source run's own command first (it moves the file to quarantine/ and plays the "
            "episode again)",
        )
    attach_specs(source, cfg.report.dataset, required=True)
    # Only the auditor is needed: it alone is planned and checked (a missing model is named
    # auditor.model.path), then the other roles point at its model so the pool starts one engine.
    ready = preflight(cfg, roles=("auditor",), episodes=False)
    pack = ready.pack
    engines = auditor_pool(ready)
    out, ident = out_dir(cfg, source, pack)
    src_root = source.path.resolve()
    if src_root in out.resolve().parents:
        raise ConfigError(
            "out_dir",
            f"{out} is inside the source run {source.path}: a re-audit never writes into "
            "the run it judges; use a folder of its own",
        )
    reauditor = f"{ready.bindings['auditor'].label} (seed {cfg.seed})"  # `scripted` when no model judged
    store = RunDir(out, record=ReauditResult)
    store.open(
        {
            "kind": REAUDIT_KIND,
            **provenance.environment(),
            "config": cfg.source,
            "source": {
                "path": str(src_root),
                "label": source.label,
                "identity": source.manifest.get("identity"),
                "episodes": len(source.results),
            },
            "dataset": source.manifest.get("dataset"),
            "prompts": {"path": str(Path(pack.root).resolve()), "sha256": pack.sha256, "files": ident.parts["prompts"]},
            "models": {"auditor": {**engines.describe()["auditor"], "weights": ident.parts["models"]["auditor"]}},
        },
        ident,
    )
    for line in run_notes([source]):  # e.g. unfinished episodes: not judged, and not in the agreement
        print(f"note: {line}")
    todo = [(source.specs[r.spec_id], r) for r in source.results.values()]
    sizes = {r.episode: len(r.turns) for _, r in todo}

    def work(
        calls: CallService, names: Iterable[str], save: Callable[[ReauditResult], None]
    ) -> Awaitable[dict[str, ReauditResult]]:
        chosen = set(names)
        return reaudit_all(
            [t for t in todo if t[1].episode in chosen],
            calls,
            ready.cfg.concurrency,
            on_result=save,
            failure_modes=ready.cfg.audit.failure_modes,
        )

    done = judge_run(ready, engines, store, "re-audit", sizes, work)
    if isinstance(done, Exit):
        done.print()
        return done.code
    pairs = [(r, done[sid]) for sid, r in source.results.items() if sid in done]
    agr = agreement(pairs)
    print(write_agreement(out, agr, f"{source.label} ({source.path})", reauditor))
    if cfg.audit.failure_modes:
        modes = reaudit_modes(reauditor, str(out), [done[sid] for sid in source.results if sid in done])
        print(f"failure modes: {', '.join(str(p) for p in write_modes(out, [modes]))}")
    print(f"re-audit directory: {out}")
    return 0
