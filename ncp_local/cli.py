"""Mode dispatch behind `run.py`: validate everything, then do the work.

Order matters for the user: config, dataset and model paths are checked
before any engine starts, and every such failure is one line on stderr and
exit code 2.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from . import config as config_mod
from .config import ConfigError, RunConfig
from .episode import EpisodeResult
from .llm.factory import Engines
from .progress import Metered, Progress
from .metrics import aggregate, episode_metrics, results_table
from .prompts import BUILD_TEMPLATES, TEMPLATES, PromptPack
from .roles import Player, narrator_factory, narrator_options
from .runner import RoleBinding, Runner, RunSettings, Sampling, SystematicFailure, systematic_invalid
from .llm.base import EngineDead
from .spec import Dataset, Spec, SpecError, dataset_summary, load_dataset
from .store import DiskFull, RunDir, RunLocked, RunMismatch, resume_hint
from . import identity as identity_mod, provenance

from .exits import EXIT_BAD_INPUT, EXIT_ENGINE_DEAD, EXIT_SIGNAL, EXIT_SYSTEMATIC

ROLES = ("narrator", "player", "auditor")


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(dcfg: DictConfig) -> int:
    try:
        raw: dict[str, Any] = OmegaConf.to_container(dcfg, resolve=True)  # type: ignore[assignment]
    except Exception as exc:  # interpolation errors name the key themselves
        return fail(f"config: {exc}".splitlines()[0])
    try:
        cfg = config_mod.validate(raw)
        if cfg.mode in ("report", "reaudit") or (cfg.mode == "review" and not cfg.review.sheet):
            require_finished(cfg.runs)
        if cfg.mode == "lint":
            return lint(cfg)
        if cfg.mode == "plan":
            from .plan import main as plan_main
            return plan_main(cfg)
        if cfg.mode == "run":
            return run(cfg, raw)
        if cfg.mode == "report":
            from .report import report_main
            return report_main(cfg)
        if cfg.mode == "review":
            from .report import review_main
            return review_main(cfg)
        if cfg.mode == "bench":
            return bench(cfg)
        if cfg.mode == "build":
            return build(cfg, raw)
        if cfg.mode == "reaudit":
            from .reaudit import reaudit_main
            return reaudit_main(cfg, raw)
        if cfg.mode == "merge":
            from .merge import main as merge_main
            return merge_main(cfg, raw)
        if cfg.mode == "rerun":
            # The finished run's own config from its manifest, found again here by content.
            raw = identity_mod.rerun_config(raw)
            return run(config_mod.validate(raw), raw)
        raise ConfigError("mode", f"unknown mode {cfg.mode!r} (known: run, plan, lint, build, bench, report, reaudit, "
                          "review, merge, rerun)")
    except (SpecError, RunLocked, RunMismatch) as exc:
        return fail(str(exc))
    except DiskFull as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except EngineDead as exc:  # run() handles its own (with the resume hint); the other modes land here
        print(f"error: engine died: {exc}", file=sys.stderr)
        return EXIT_ENGINE_DEAD


def require_finished(runs: list[str]) -> None:
    """A run directory with no finished episode would give an empty report, re-audit or review and exit 0."""
    for d in runs:
        root = Path(d).expanduser()
        parts = [root] + sorted(root.glob("shard-*-of-*")) if root.is_dir() else []
        # Only run directories: anything else gets the report's own "not a run directory".
        if any((p / "results").is_dir() for p in parts) and not any(any(p.glob("results/*.json")) for p in parts):
            raise SpecError(root, "runs", "no finished episode (results/ is empty): nothing to report; "
                            "finish the run first (its own command resumes it)")


class EpisodeSetup(NamedTuple):
    """What running episodes needs, read and checked before any engine starts."""

    dataset: Dataset
    narrator_cls: type
    pack: PromptPack
    player: Player
    engines: Engines


def episode_setup(cfg: RunConfig, roles: tuple[str, ...] = ROLES) -> EpisodeSetup:
    ds = load_dataset(config_mod.dataset_path(cfg), limit=cfg.limit)
    narrator_cls = narrator_factory(str(cfg.method.get("name", "baseline")))
    narrator_options(narrator_cls, method_options(cfg))  # refused here, before any engine starts
    pack = PromptPack.load(cfg.prompts.get("dir"), required=TEMPLATES + tuple(getattr(narrator_cls, "TEMPLATES", ())))
    player = Player(str(cfg.condition.get("name", "")))
    engines = Engines(cfg, roles=roles)
    engines.check()  # model paths and engine settings
    return EpisodeSetup(ds, narrator_cls, pack, player, engines)


def _say(line: str) -> None:
    """A progress line of a long mode (bench), on stderr so the results on stdout stay clean."""
    print(line, file=sys.stderr, flush=True)


def bench(cfg: RunConfig) -> int:
    """`mode=bench`: one workload three ways on the narrator's model (see ncp_local/bench.py)."""
    from .bench import bench as run_bench

    if cfg.bench.sweep:
        return bench_sweep(cfg)
    from .plan import preflight

    cfg = preflight(cfg)  # memory shares and windows as mode=run plans them
    ds, narrator_cls, pack, player, engines = episode_setup(cfg, roles=("narrator",))
    b = cfg.bench
    rc = cfg.narrator
    print(f"bench: {b.episodes} episodes x {b.turns} turns on {rc.model.name} ({cfg.engine.name}), "
          f"max_tokens={rc.max_tokens}, seed={cfg.seed}", flush=True)

    async def go() -> list[str]:
        backends = await engines.start()
        try:
            return await run_bench(backends["narrator"], rc.model.name,
                                   Sampling(rc.temperature, rc.top_p, rc.max_tokens), ds.specs, pack, narrator_cls,
                                   player, cfg.seed, b.episodes, b.turns, b.throughput, b.sequential,
                                   b.sequential_episodes, bounds={r: getattr(cfg, r).bounds for r in ROLES},
                                   note=_say)
        finally:
            await engines.close()

    for line in asyncio.run(go()):
        print(line)
    return 0


def bench_sweep(cfg: RunConfig) -> int:
    """`mode=bench bench.sweep={key: [values]}`: the sweep batched and point by point (ncp_local/bench.py)."""
    from .bench import sweep_bench, sweep_configs
    from .plan import preflight

    # Each point as mode=run plans it alone (the sweeps this compares share one engine).
    points = [(label, preflight(point)) for label, point in sweep_configs(cfg)]
    setups = [episode_setup(p) for _, p in points]  # every point checked before any engine starts
    ds, narrator_cls, pack, player, _ = setups[0]
    b = cfg.bench
    print(f"bench: sweep of {len(points)} points x {b.episodes} episodes x {b.turns} turns ({cfg.engine.name}), "
          "batched then point by point", flush=True)
    for line in asyncio.run(sweep_bench(points, ds.specs, pack, narrator_cls, player, b.episodes, b.turns,
                                        b.sequential, note=_say)):
        print(line)
    return 0


def build(cfg: RunConfig, raw: dict[str, Any]) -> int:
    """`mode=build sources=FILE.yaml out=DIR`: specs from synopses, on the auditor's model."""
    from .build import build_all, load_sources

    if not cfg.sources:
        raise ConfigError("sources", "mode=build needs sources=FILE.yaml (id, title, genres, player_role, synopsis)")
    if not cfg.out:
        raise ConfigError("out", "mode=build needs out=DIR for the built specs")
    from .plan import preflight

    cfg = preflight(cfg)
    sources = load_sources(cfg.sources)
    pack = PromptPack.load(cfg.prompts.get("dir"), required=BUILD_TEMPLATES)
    engines = Engines(cfg)
    engines.check()
    out = Path(cfg.out)
    store = RunDir(out / ".build")
    store.open({"config": raw, "sources": str(cfg.sources), **provenance.environment()},
               identity_mod.of_build(cfg, raw, pack.templates, cfg.sources))

    async def go() -> dict[str, str]:
        backends = await engines.start()
        try:
            rc = cfg.auditor
            roles = {"auditor": RoleBinding(backends["auditor"], Sampling(rc.temperature, rc.top_p, rc.max_tokens),
                                            rc.model.name, rc.bounds)}
            runner = Runner(specs=(), roles=roles, pack=pack, store=store, settings=RunSettings(seed=cfg.seed),
                            make_narrator=lambda: None, player=None)  # type: ignore[arg-type,return-value]
            return await build_all(runner, sources, out)
        finally:
            await engines.close()

    try:
        status = asyncio.run(go())
    finally:
        store.close()
    for sid, st in status.items():
        print(f"{sid}: {st}")
    print(f"specs written to {out} (check with: python run.py mode=lint dataset.path={out})")
    return 0 if all(st == "ok" for st in status.values()) else 1


def lint(cfg: RunConfig) -> int:
    ds = load_dataset(config_mod.dataset_path(cfg))
    for w in ds.warnings:
        print(w)
    print(dataset_summary(ds))
    return 0


def manifest(cfg: RunConfig, raw: dict[str, Any], ds: Dataset, pack: PromptPack,
             engines: Engines, ident: identity_mod.Identity | None = None) -> dict[str, Any]:
    """What the run is (config, content hashes per file, weights) and what it ran on (provenance)."""
    ident = ident or identity_mod.of_run(cfg, raw, ds.root, pack.templates)
    models = engines.describe()
    for role, weights in ident.parts["models"].items():
        if role in models:
            # The revision as configured, and as the download left it on disk (often the only record).
            found = provenance.hf_revision(models[role]["path"]) if weights.get("kind") == "files" else None
            models[role] = {**models[role], "weights": weights, "revision_on_disk": found}
    return {
        **provenance.environment(),
        "config": raw,
        "dataset": {"path": str(ds.root.resolve()), "sha256": ds.sha256, "specs": [s.id for s in ds.specs],
                    "files": ident.parts["dataset"]},
        "prompts": {"path": str(Path(pack.root).resolve()), "sha256": pack.sha256, "files": ident.parts["prompts"]},
        "models": models,
    }


def run(cfg: RunConfig, raw: dict[str, Any]) -> int:
    from .plan import preflight

    cfg = preflight(cfg)  # memory shares, devices, windows (ncp_local/plan): refused here, or started as planned
    ds, narrator_cls, pack, player, engines = episode_setup(cfg)  # all checked before anything starts
    specs = config_mod.shard_specs(cfg, ds.specs)
    ident = identity_mod.of_run(cfg, raw, ds.root, pack.templates)
    out = config_mod.shard_dir(cfg, config_mod.run_dir(cfg, raw, ident.key))
    store = RunDir(out)
    store.open(manifest(cfg, raw, ds, pack, engines, ident), ident)
    stopped: list[str] = []
    try:
        if all(store.has_result(s.id) for s in specs):
            # Nothing to run: no engine is started, the stored results are reported.
            print(f"all {len(specs)} episodes already finished in {out}; nothing left to do")
            results = {s.id: store.load_result(s.id) for s in specs}
        else:
            results = asyncio.run(_run_async(cfg, specs, pack, narrator_cls, player, engines, store, stopped))
        if not stopped:
            store.mark_done(len(specs))
    except asyncio.CancelledError:
        results = {}
    except EngineDead as exc:
        print(f"error: engine died: {exc}; " + resume_hint("every committed turn is checkpointed", out),
              file=sys.stderr)
        return EXIT_ENGINE_DEAD
    except SystematicFailure as exc:
        print(f"error: {exc}; the run stopped early (fix the cause, then re-run)", file=sys.stderr)
        return EXIT_SYSTEMATIC
    finally:
        store.close()
    if stopped:
        left = sum(not store.has_result(s.id) for s in specs)
        print(f"stopped by {stopped[0]}: " + resume_hint(f"{left} unfinished episode(s) checkpointed", out),
              file=sys.stderr)
        return EXIT_SIGNAL[stopped[0]]
    rows = [(out.name, aggregate([episode_metrics(r) for r in results.values()], cfg.max_turns))]
    print(results_table(rows))
    _print_call_summary(store)
    print(f"run directory: {out}")
    broken = systematic_invalid(results.values(), cfg.max_invalid_share)
    if broken:
        print(f"error: {broken} (max_invalid_share={cfg.max_invalid_share})", file=sys.stderr)
        return EXIT_SYSTEMATIC
    return 0


async def _run_async(cfg: RunConfig, specs: tuple[Spec, ...], pack: PromptPack, narrator_cls: type,
                     player: Player, engines: Engines, store: RunDir, stopped: list[str]) -> dict[str, EpisodeResult]:
    # SIGTERM (Slurm preemption) and SIGINT cancel the run; each committed turn
    # is already on disk, so cancelling loses at most the turns in flight.
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        def on_signal(name: str = sig.name) -> None:
            stopped.append(name)
            if task:
                task.cancel()
        loop.add_signal_handler(sig, on_signal)
    backends = await engines.start()
    try:
        bar = _progress(cfg, specs, store)
        roles = {}
        for role in ROLES:
            rc = getattr(cfg, role)
            roles[role] = RoleBinding(backend=Metered(backends[role], bar), model=rc.model.name,
                                      sampling=Sampling(rc.temperature, rc.top_p, rc.max_tokens), bounds=rc.bounds)
        settings = RunSettings(seed=cfg.seed, max_turns=cfg.max_turns, concurrency=cfg.concurrency)
        runner = Runner(specs=specs, roles=roles, pack=pack, store=store, settings=settings,
                        make_narrator=lambda: narrator_cls(pack=pack, roles=roles,
                                                           **narrator_options(narrator_cls, method_options(cfg))),
                        player=player, on_result=lambda r: bar.result("run", r.spec_id, len(r.turns)),
                        on_turn=lambda sid, n: bar.turn("run", sid, n))
        bar.start()
        try:
            return await runner.run()
        except BaseExceptionGroup as group:
            # Surface the first non-episode failure (a dead engine) as itself.
            raise group.exceptions[0] from None
        finally:
            bar.close()
    finally:
        await engines.close()


def method_options(cfg: RunConfig) -> dict[str, Any]:
    """Everything under `method` except its name goes to the narrator's constructor."""
    return {k: v for k, v in cfg.method.items() if k != "name"}


def _progress(cfg: RunConfig, specs: tuple[Spec, ...], store: RunDir) -> Progress:
    """Turns committed of turns possible, calls and tokens per second, ETA (ncp_local/progress.py)."""
    bar = Progress(enabled=cfg.progress, every_s=cfg.progress_every_s)
    bar.add_run("run", [s.id for s in specs], cfg.max_turns, store.root)
    return bar


def _print_call_summary(store: RunDir) -> None:
    from .store import read_calls

    if not Path(store.calls_path).exists():
        return
    calls = read_calls(store.calls_path)
    by_stage: dict[str, dict[str, int]] = {}
    for c in calls:
        s = by_stage.setdefault(c["stage"], {"calls": 0, "failed": 0, "length": 0})
        s["calls"] += 1
        s["failed"] += c.get("error") is not None
        s["length"] += c.get("finish_reason") == "length"
    print("calls: " + " ".join(f"{k}={v['calls']}(failed {v['failed']}, cut {v['length']})"
                               for k, v in sorted(by_stage.items())))
    prompt = sum(c.get("prompt_tokens", 0) for c in calls)
    cached = sum(c.get("cached_tokens", 0) for c in calls)
    print(f"tokens: prompt={prompt} cached={cached} generated={sum(c.get('generated_tokens', 0) for c in calls)}"
          + (f" cache_hit={cached / prompt:.2f}" if prompt else ""))


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)
