"""Re-audit a finished run with another auditor, without new narration.

Every recorded turn is judged again by the configured auditor with the
stages a turn uses (fact_update -> conflict_check -> double_check when the
first check finds conflicts), through `Runner.ask`, so retries, per-call
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
import json
import math
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from pydantic import BaseModel, ConfigDict

from . import identity as identity_mod, provenance
from .config import ConfigError
from .episode import CallFailed, EpisodeResult, FactUpdateRecord, audit_response
from .llm.base import EngineDead
from .llm.factory import Engines
from .prompts import PromptPack
from .report.replay import TurnView, replay
from .report.runs import REAUDIT_KIND, Run, attach_specs, load_run
from .report.stats import cohen_kappa, confusion, pearson, spearman
from .report.tables import csv_text, markdown_table, write
from .runner import RoleBinding, Runner, RunSettings, Sampling
from .spec import Spec
from .stages import CONFLICT_TYPES
from .store import RunDir, resume_hint


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TurnAudit(_Record):
    turn: int
    fact_update: FactUpdateRecord | None = None
    conflict_check: dict[str, Any] | None = None
    double_check: dict[str, Any] | None = None
    conflicts: tuple[dict[str, Any], ...] = ()  # what stands after the double-check
    error: str = ""  # a call stayed invalid: the turn is left out of the agreement

    @property
    def judged(self) -> bool:
        return not self.error


class ReauditResult(_Record):
    spec_id: str
    source_termination: str
    turns: tuple[TurnAudit, ...]


Ask = Callable[..., Awaitable[Any]]


async def audit_turn(spec: Spec, view: TurnView, ask: Ask) -> TurnAudit:
    """PROTOCOL section 3, steps 3-5, on a recorded turn and the state before it."""
    rec = view.record
    try:
        audit = await audit_response(spec, view.before, view.projected, rec.player_input, rec.response, ask)
    except CallFailed as exc:
        return TurnAudit(turn=rec.turn, error=str(exc))
    return TurnAudit(turn=rec.turn, **audit.record_fields())


async def reaudit_episode(spec: Spec, result: EpisodeResult, runner: Runner, gate: asyncio.Semaphore) -> ReauditResult:
    rp = replay(spec, result)

    async def one(view: TurnView) -> TurnAudit:
        async def ask(stage: str, template: str, variables: dict[str, str], **kw: Any) -> Any:
            return await runner.ask(spec.id, view.record.turn, stage, template, variables, **kw)

        async with gate:
            return await audit_turn(spec, view, ask)

    audits = await asyncio.gather(*(one(v) for v in rp.turns))
    return ReauditResult(spec_id=spec.id, source_termination=result.termination, turns=tuple(audits))


async def reaudit_all(items: Sequence[tuple[Spec, EpisodeResult]], runner: Runner, concurrency: int,
                      on_result: Callable[[ReauditResult], None] | None = None) -> dict[str, ReauditResult]:
    gate = asyncio.Semaphore(max(1, concurrency))
    out: dict[str, ReauditResult] = {}

    async def episode(spec: Spec, result: EpisodeResult) -> None:
        res = await reaudit_episode(spec, result, runner, gate)
        out[spec.id] = res
        if on_result:
            on_result(res)

    try:
        async with asyncio.TaskGroup() as tg:
            for spec, result in items:
                tg.create_task(episode(spec, result))
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None  # a dead engine, as itself
    return out


# ---- agreement ----------------------------------------------------------------

def _types(conflicts: Sequence[dict[str, Any]]) -> set[str]:
    return {c["type"] for c in conflicts}


def turn_pairs(pairs: Sequence[tuple[EpisodeResult, ReauditResult]]) -> list[dict[str, Any]]:
    rows = []
    for src, re_ in pairs:
        audits = {a.turn: a for a in re_.turns}
        for rec in src.turns:
            a = audits.get(rec.turn)
            if a is None or not a.judged:
                continue
            rows.append({"spec_id": src.spec_id, "turn": rec.turn,
                         "original": _types(rec.conflicts), "reaudit": _types(a.conflicts),
                         "original_first": bool(rec.conflict_check.get("conflicts")),
                         "reaudit_first": bool((a.conflict_check or {}).get("conflicts"))})
    return rows


def episode_pairs(pairs: Sequence[tuple[EpisodeResult, ReauditResult]]) -> list[dict[str, Any]]:
    """Per-episode metrics under each auditor.

    Under the re-auditor the episode would have ended at its first standing
    conflict; past the recorded turns nothing is known, so turns are
    censored at the recorded length (as the original's are at max_turns).
    Episodes that ended `invalid`, or with a turn the re-auditor failed to
    judge, are left out.
    """
    rows = []
    for src, re_ in pairs:
        if src.termination == "invalid" or any(not a.judged for a in re_.turns):
            continue
        orig = _types(src.turns[-1].conflicts) if src.termination == "conflict" else set()
        first = next((a for a in sorted(re_.turns, key=lambda a: a.turn) if a.conflicts), None)
        re_types = _types(first.conflicts) if first else set()
        row: dict[str, Any] = {"spec_id": src.spec_id, "turns_original": len(src.turns),
                               "turns_reaudit": first.turn + 1 if first else len(src.turns)}
        for t in (*CONFLICT_TYPES, "conflict"):
            row[f"{t}_original"] = int(bool(orig) if t == "conflict" else t in orig)
            row[f"{t}_reaudit"] = int(bool(re_types) if t == "conflict" else t in re_types)
        row["conflict_turns_reaudit"] = sum(bool(a.conflicts) for a in re_.turns)
        rows.append(row)
    return rows


EPISODE_METRICS = (("turns", "turns to first conflict (censored)"), ("fact", "fact conflict"),
                   ("commitment", "commitment conflict"), ("player_input", "player-input conflict"),
                   ("conflict", "any conflict"))


def agreement(pairs: Sequence[tuple[EpisodeResult, ReauditResult]]) -> dict[str, Any]:
    turns = turn_pairs(pairs)
    failed = sum(not a.judged for _, r in pairs for a in r.turns)
    per_turn = {}
    labels = [("conflict", lambda s: bool(s)), *((t, (lambda s, t=t: t in s)) for t in CONFLICT_TYPES)]
    for name, f in labels:
        a = [f(r["original"]) for r in turns]
        b = [f(r["reaudit"]) for r in turns]
        per_turn[name] = {"kappa": cohen_kappa(a, b), "agree": _share(a, b), **confusion(a, b)}
    a = [r["original_first"] for r in turns]
    b = [r["reaudit_first"] for r in turns]
    per_turn["conflict_first_check"] = {"kappa": cohen_kappa(a, b), "agree": _share(a, b), **confusion(a, b)}
    cross: dict[str, dict[str, int]] = {a: {b: 0 for b in CROSS_LABELS} for a in CROSS_LABELS}
    for r in turns:
        cross[_cross_label(r["original"])][_cross_label(r["reaudit"])] += 1
    eps = episode_pairs(pairs)
    per_episode = {}
    for key, _ in EPISODE_METRICS:
        x = [r[f"{key}_original"] for r in eps]
        y = [r[f"{key}_reaudit"] for r in eps]
        per_episode[key] = {"original": _mean(x), "reaudit": _mean(y), "pearson": pearson(x, y),
                            "spearman": spearman(x, y)}
    return {"turns": len(turns), "failed_turns": failed, "episodes": len(eps), "per_turn": per_turn,
            "types": cross, "per_episode": per_episode, "turn_rows": turns, "episode_rows": eps}


CROSS_LABELS = ("none", *CONFLICT_TYPES, "several")


def _cross_label(types: set[str]) -> str:
    return "none" if not types else next(iter(types)) if len(types) == 1 else "several"


def _share(a: Sequence[bool], b: Sequence[bool]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a) if a else math.nan


def _mean(x: Sequence[float]) -> float:
    return sum(x) / len(x) if x else math.nan


def _f(x: float, d: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def agreement_markdown(agr: dict[str, Any], source: str, reauditor: str) -> str:
    head = ("item", "kappa", "agree %", "both yes", "original only", "re-audit only", "both no")
    names = {"conflict": "conflict (after double-check)", "conflict_first_check": "conflict (first check)",
             "fact": "fact", "commitment": "commitment", "player_input": "player_input"}
    turn_rows = []
    for key in ("conflict", "conflict_first_check", *CONFLICT_TYPES):
        r = agr["per_turn"][key]
        turn_rows.append([names[key], _f(r["kappa"]), _f(100 * r["agree"], 1) if r["agree"] == r["agree"] else "n/a",
                          r["yes_yes"], r["yes_no"], r["no_yes"], r["no_no"]])
    ep_rows = []
    for key, label in EPISODE_METRICS:
        r = agr["per_episode"][key]
        scale, d = (1, 2) if key == "turns" else (100, 1)
        ep_rows.append([label + ("" if key == "turns" else " %"), _f(scale * r["original"], d),
                        _f(scale * r["reaudit"], d), _f(r["pearson"]), _f(r["spearman"])])
    return (f"# Re-audit agreement\n\noriginal: {source}\n\nre-auditor: {reauditor}\n\n"
            f"## Per turn ({agr['turns']} turns judged by both"
            + (f"; {agr['failed_turns']} the re-auditor failed to judge" if agr["failed_turns"] else "") + ")\n\n"
            + markdown_table(head, turn_rows)
            + "\n\nConflict type per turn (rows: original, columns: re-audit):\n\n"
            + markdown_table(("original \\ re-audit", *CROSS_LABELS),
                             [[a, *(agr["types"][a][b] for b in CROSS_LABELS)] for a in CROSS_LABELS])
            + f"\n\n## Per episode ({agr['episodes']} episodes)\n\n"
            + markdown_table(("metric", "original", "re-audit", "Pearson", "Spearman"), ep_rows)
            + "\n\nRe-audit turns are censored at the recorded length: after the original's last turn "
              "nothing was narrated.\n")


def write_agreement(out: Path, agr: dict[str, Any], source: str, reauditor: str) -> str:
    md = agreement_markdown(agr, source, reauditor)
    write(out / "agreement.md", md)
    summary = {k: v for k, v in agr.items() if k not in ("turn_rows", "episode_rows")}
    write(out / "agreement.json", json.dumps(summary, indent=1, default=_json_nan))
    write(out / "agreement_turns.csv", csv_text(
        ("spec_id", "turn", "original", "reaudit", "original_first_check", "reaudit_first_check"),
        [[r["spec_id"], r["turn"], " ".join(sorted(r["original"])), " ".join(sorted(r["reaudit"])),
          int(r["original_first"]), int(r["reaudit_first"])] for r in agr["turn_rows"]]))
    eps = agr["episode_rows"]
    cols = list(eps[0]) if eps else ["spec_id"]
    write(out / "agreement_episodes.csv", csv_text(cols, [[r[c] for c in cols] for r in eps]))
    return md


def _json_nan(x: Any) -> Any:
    return str(x)


# ---- mode=reaudit -----------------------------------------------------------------

def _identity(cfg: Any, raw: dict[str, Any], pack: PromptPack, source: Run) -> identity_mod.Identity:
    # Tied to the source run's identity (its path when it has none), so a re-audit
    # never shares an identity with a run or with a re-audit of another run.
    src = source.manifest.get("identity") or str(source.path.resolve())
    return identity_mod.of_reaudit(cfg, raw, pack.templates, f"{REAUDIT_KIND}/{src}")


def _load_done(store: RunDir) -> dict[str, ReauditResult]:
    # Verified when the store opened: a failing file was moved to quarantine/ and is judged again.
    return {r.spec_id: r for r in store.iter_results()}


def auditor_table(cfg: Any, paths: Sequence[str]) -> int:
    """Several auditors of the same episodes (re-audits of one run, with or without the run itself, or runs
    that differ in their auditor): the paper's Table 2 (report/auditors.py). No model is loaded."""
    from .report.auditors import main as table_main

    out = Path(cfg.report.out).expanduser() if cfg.report.out else None
    return table_main(paths, out, cfg.report.resamples, cfg.report.seed, cfg.report.level)


def out_dir(cfg: Any, raw: dict[str, Any], source: Run, pack: PromptPack) -> tuple[Path, identity_mod.Identity]:
    """The re-audit's directory (`out_dir`, else runs/reaudit-<source>-<identity>) and its identity."""
    ident = _identity(cfg, raw, pack, source)
    out = Path(cfg.out_dir).expanduser() if cfg.out_dir else Path("runs") / f"reaudit-{source.key}-{ident.key}"
    return out, ident


def point_dir(cfg: Any, raw: dict[str, Any]) -> Path:
    """Where `mode=reaudit` with this config writes (a sweep's index names it)."""
    source = load_run(cfg.runs[0])
    return out_dir(cfg, raw, source, PromptPack.load(cfg.prompts.get("dir")))[0]


def reaudit_main(cfg: Any, raw: dict[str, Any]) -> int:
    from .exits import EXIT_ENGINE_DEAD
    from .report.runs import expand_runs

    runs = expand_runs(list(cfg.runs)) if cfg.runs else []
    if len(runs) > 1:
        return auditor_table(cfg, runs)
    if len(runs) != 1:
        raise ConfigError("runs", "reaudit takes one run directory to judge again (runs=[DIR]), or several "
                          "re-audits / runs for the auditor table (runs=[A,B,...] or a sweep folder)")
    source = load_run(runs[0])
    attach_specs(source, cfg.report.dataset, required=True)
    pack = PromptPack.load(cfg.prompts.get("dir"))
    # Only the auditor is needed: point the other roles at its model so that
    # the factory starts exactly one engine.
    acfg = cfg.model_copy(update={"narrator": cfg.auditor, "player": cfg.auditor})
    from .plan import preflight

    acfg = preflight(acfg)  # the auditor's memory share as mode=run plans it
    engines = Engines(acfg)
    engines.check()
    out, ident = out_dir(cfg, raw, source, pack)
    src_root = source.path.resolve()
    if src_root in out.resolve().parents:
        raise ConfigError("out_dir", f"{out} is inside the source run {source.path}: a re-audit never writes into "
                          "the run it judges; use a folder of its own")
    reauditor = f"{cfg.auditor.model.name} (seed {cfg.seed})"
    store = RunDir(out, record=ReauditResult)
    store.open({
        "kind": REAUDIT_KIND,
        **provenance.environment(),
        "config": raw,
        "source": {"path": str(src_root), "label": source.label,
                   "identity": source.manifest.get("identity"), "episodes": len(source.results)},
        "dataset": source.manifest.get("dataset"),
        "prompts": {"path": str(Path(pack.root).resolve()), "sha256": pack.sha256, "files": ident.parts["prompts"]},
        "models": {"auditor": {**engines.describe()["auditor"], "weights": ident.parts["models"]["auditor"]}},
    }, ident)
    try:
        done = _load_done(store)
        todo = [(source.specs[sid], r) for sid, r in source.results.items() if sid not in done]
        if todo:
            done.update(asyncio.run(_run(acfg, pack, engines, store, todo)))
        else:
            print(f"all {len(done)} episodes already re-audited in {out}; nothing left to do")
        store.mark_done(len(done))
    except EngineDead as exc:
        print(f"error: engine died: {exc}; " + resume_hint("finished episodes are saved", out), file=sys.stderr)
        return EXIT_ENGINE_DEAD
    finally:
        store.close()
    pairs = [(r, done[sid]) for sid, r in source.results.items() if sid in done]
    agr = agreement(pairs)
    print(write_agreement(out, agr, f"{source.label} ({source.path})", reauditor))
    print(f"re-audit directory: {out}")
    return 0


async def _run(cfg: Any, pack: PromptPack, engines: Engines, store: RunDir,
               todo: list[tuple[Spec, EpisodeResult]]) -> dict[str, ReauditResult]:
    backends = await engines.start()
    try:
        rc = cfg.auditor
        binding = RoleBinding(backend=backends["auditor"], model=rc.model.name,
                              sampling=Sampling(rc.temperature, rc.top_p, rc.max_tokens), bounds=rc.bounds)
        runner = Runner(specs=tuple(s for s, _ in todo), roles={"auditor": binding}, pack=pack, store=store,
                        settings=RunSettings(seed=cfg.seed, concurrency=cfg.concurrency),
                        make_narrator=lambda: None, player=None)  # type: ignore[arg-type]

        bar = _progress(cfg, len(todo))

        def save(res: ReauditResult) -> None:
            store.write_result(res)
            if bar:
                bar.update(1)

        try:
            return await reaudit_all(todo, runner, cfg.concurrency, on_result=save)
        finally:
            if bar:
                bar.close()
    finally:
        await engines.close()


def _progress(cfg: Any, total: int) -> Any:
    if not cfg.progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="re-audit", unit="ep", file=sys.stderr)
