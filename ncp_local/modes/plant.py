"""`mode=plant`: an auditor measured against contradictions of known truth planted into a finished run.

From the run `runs=[DIR]`, `plant.turns` clean turns are drawn per episode (seeded), and each gives its
items (protocol/plant.py): the turn as played, and the turn with one contradiction planted per type of
`plant.types`. The configured auditor judges every item with the stages a turn uses (fact update,
conflict check, double-check; episode.audit_response), on the state the turn was told in, through the
call service (retries, per-call seeds, the call log), all items at once.

Output: a plant directory beside the run, `plant-<run>-<identity>` (or `out_dir`): manifest with
`kind: plant`, results/<episode>.json per episode (sealed, so a rerun resumes), calls.jsonl, and the
figures: plants.{md,csv,html} and a plot (and, with `tracker=mlflow|wandb`, the figures logged there too).
Its identity holds the run's, the items' digest, the auditor
and the prompts, so an auditor sweep (`-m auditor=a,b`) judges the same items in directories of its own.
Several plant directories (`runs=[P1,P2,...]`, no model loads) give the figures side by side and the
paired differences; so does mode=report given them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..bindings import Bindings
from ..config import ConfigError, RunConfig, ScriptedEngineCfg
from ..errors import InputError
from ..execution.calls import CallService
from ..execution.engine_pool import embedded_note
from ..execution.failures import Exit
from ..execution.preflight import preflight
from ..execution.rejudge import auditor_pool, each_episode, judge_run
from ..protocol.plant import (
    ItemAudit,
    PlantedItem,
    PlantResult,
    draw_items,
    items_digest,
    judge_item,
    rewrite_item,
)
from ..protocol.prompts import TEMPLATES, PromptPack
from ..protocol.replay import TurnView, replay
from ..protocol.spec import Spec
from ..protocol.stages import CONFLICT_TYPES
from ..report.plant_dirs import PLANT_KIND, is_plant_dir, load_plant_dir, plant_figures
from ..report.plants_doc import write_plant_report
from ..report.runs import Run, attach_specs, expand_runs, load_run
from ..rundir import identity as identity_mod
from ..rundir import provenance
from ..rundir.layout import require_finished
from ..rundir.store import RunDir
from ..tracking import require, track_run

Items = dict[str, list[PlantedItem]]  # episode -> its items
Results = dict[str, PlantResult]  # episode -> its items judged


def draw(cfg: RunConfig, source: Run) -> Items:
    """Every episode's items; refused in one line when the run has no clean turn, or never had what a
    type asked for needs (exit 2, before any model loads)."""
    items: Items = {}
    for name, result in source.results.items():
        drawn = draw_items(
            source.specs[result.spec_id], result, cfg.plant.types, cfg.plant.turns, cfg.plant.place, cfg.plant.seed
        )
        if drawn:
            items[name] = drawn
    if not items:
        raise InputError(
            source.path, "runs", "no finished turn that committed clean: nothing to plant into (finish the run first)"
        )
    for kind in cfg.plant.types:
        if not any(i.kind == kind for its in items.values() for i in its):
            need = {"fact": "an active fact", "commitment": "a pending commitment"}.get(kind, kind)
            raise InputError(
                source.path,
                "plant.types",
                f"the run never had {need} at a clean turn drawn, so no {kind} contradiction can be planted; "
                f"leave {kind} out of plant.types",
            )
    return items


def planter(cfg: RunConfig, pack: PromptPack) -> dict[str, Any] | None:
    """The planting model as the items' identity holds it (its role's settings, weights and prompt); None
    when the fixed edits alone plant."""
    role = cfg.plant.model
    if role is None:
        return None
    return {
        "role": role,
        "settings": cfg.source.get(role),
        "models": identity_mod.role_models(cfg, (role,)),
        "prompt": pack.templates["plant_rewrite"],
    }


def digest_of(cfg: RunConfig, items: Items, pack: PromptPack) -> str:
    return items_digest([i for its in items.values() for i in its], planter(cfg, pack))


def load_pack(cfg: RunConfig) -> PromptPack:
    return PromptPack.load(cfg.prompts.get("dir"), (*TEMPLATES, *cfg.optional_templates, *cfg.plant.templates))


def out_dir(cfg: RunConfig, source: Run, pack: PromptPack, digest: str) -> tuple[Path, identity_mod.Identity]:
    src = source.manifest.get("identity") or str(source.path.resolve())
    base = identity_mod.of_reaudit(cfg, pack.templates, f"{PLANT_KIND}/{src}")
    ident = identity_mod.Identity({**base.parts, "kind": PLANT_KIND, "plants": digest})
    out = (
        Path(cfg.out_dir).expanduser()
        if cfg.out_dir
        else source.path.resolve().parent / f"plant-{source.key}-{ident.key}"
    )
    return out, ident


def point_dir(cfg: RunConfig) -> Path:
    """Where `mode=plant` with this config writes (a sweep's table reads it)."""
    source = load_run(cfg.runs[0])
    attach_specs(source, cfg.report.dataset, required=True)
    items = draw(cfg, source)
    pack = load_pack(cfg)
    return out_dir(cfg, source, pack, digest_of(cfg, items, pack))[0]


SCRIPTED_NOTE = "a scripted auditor: its figures are the rates it was given (engine.plant_*), drawn at random"


def what_it_measures(bindings: Bindings) -> list[str]:
    """The lines the figures carry when they measure no real auditor: the embedded model, or scripted answers."""
    note = embedded_note(bindings, ("auditor",))
    if note:
        return [note.removeprefix("note: ")]
    return [SCRIPTED_NOTE] if bindings["auditor"].label == "scripted" else []


def auditor_label(cfg: RunConfig, label: str) -> str:
    """The judged auditor as the figures name it; a scripted one by the rates it was given."""
    if label != "scripted" or cfg.engine.name != "scripted":
        return f"{label} (seed {cfg.seed})" if cfg.seed else label
    assert isinstance(cfg.engine, ScriptedEngineCfg)

    def rates(by_type: dict[str, float]) -> str:
        if len(set(by_type.values())) == 1:
            return f"{next(iter(by_type.values())):g}"
        return " ".join(f"{t} {by_type[t]:g}" for t in CONFLICT_TYPES)

    e = cfg.engine
    wrong = f"; wrong id {rates(e.plant_wrong_id)}" if any(e.plant_wrong_id.values()) else ""
    return f"scripted (recall {rates(e.plant_recall)}; false alarm {rates(e.plant_false_alarm)}{wrong})"


def table(cfg: RunConfig, paths: Sequence[str]) -> int:
    """Plant directories side by side, paired where they judged the same plants. No model loads."""
    dirs = [load_plant_dir(p) for p in paths]
    out = Path(cfg.report.out).expanduser() if cfg.report.out else dirs[0].path / "figures"
    figs, cmps, notes = plant_figures(dirs, cfg.report.resamples, cfg.report.seed, cfg.report.level)
    md, _ = write_plant_report(
        out, figs, cmps, dirs[0].results, cfg.report.level, cfg.report.resamples, notes, cfg.report.html
    )
    print(md)
    print(f"plant figures: {out}")
    return 0


def main(cfg: RunConfig) -> int:
    require_finished(cfg.runs)
    runs = expand_runs(list(cfg.runs)) if cfg.runs else []
    if runs and all(is_plant_dir(r) for r in runs):
        return table(cfg, runs)
    require(cfg.tracker)  # a tracker that is not installed is refused before anything starts
    if len(runs) != 1:
        raise ConfigError("runs", "plant takes one run directory (runs=[DIR]), or plant directories to tabulate")
    source = load_run(runs[0])
    if source.damaged:
        path, why = source.damaged[0]
        raise InputError(path, "runs", f"{why}: re-run the source run's own command first")
    attach_specs(source, cfg.report.dataset, required=True)
    items = draw(cfg, source)  # every refusal of the input comes before any model loads
    roles = ("auditor", *([cfg.plant.model] if cfg.plant.model else []))  # and the planting model's
    ready = preflight(cfg, roles=roles, episodes=False, templates=(*TEMPLATES, *cfg.plant.templates))
    engines = auditor_pool(ready, keep=roles[1:])
    digest = digest_of(cfg, items, ready.pack)
    out, ident = out_dir(cfg, source, ready.pack, digest)
    if source.path.resolve() in out.resolve().parents:
        raise ConfigError("out_dir", f"{out} is inside the source run {source.path}: use a folder of its own")
    label = auditor_label(cfg, ready.bindings["auditor"].label)
    notes = what_it_measures(ready.bindings)
    weights = {**identity_mod.role_models(cfg, roles[1:]), **ident.parts["models"]}
    store = RunDir(out, record=PlantResult)
    store.open(
        {
            "kind": PLANT_KIND,
            **provenance.environment(),
            "config": cfg.source,
            "source": {
                "path": str(source.path.resolve()),
                "label": source.label,
                "identity": source.manifest.get("identity"),
            },
            "dataset": source.manifest.get("dataset"),
            "plants": {"digest": digest, "items": sum(map(len, items.values())), **cfg.plant.model_dump()},
            "auditor_label": label,
            "notes": notes,
            "prompts": {"path": str(Path(ready.pack.root).resolve()), "sha256": ready.pack.sha256},
            "models": {r: {**engines.describe()[r], "weights": weights[r]} for r in roles},
        },
        ident,
    )
    for line in notes:
        print(f"note: {line}")
    sizes = {e: len(its) for e, its in items.items()}

    def work(calls: CallService, todo: Iterable[str], save: Callable[[PlantResult], None]) -> Awaitable[Results]:
        todo_items = {e: items[e] for e in todo}
        return judge_all(source, todo_items, calls, ready.cfg.concurrency, save, rewrite=len(roles) > 1)

    done = judge_run(ready, engines, store, "plant", sizes, work, roles)
    if isinstance(done, Exit):
        done.print()
        return done.code
    code = table(
        cfg.model_copy(update={"report": cfg.report.model_copy(update={"out": cfg.report.out or str(out)})}), [str(out)]
    )
    track_run(cfg, out)  # the figures to tracker=mlflow|wandb, as mode=run's (never fails the mode)
    return code


async def _one(
    spec: Spec,
    view: TurnView,
    item: PlantedItem,
    calls: CallService,
    episode: str,
    gate: asyncio.Semaphore,
    rewrite: bool,
) -> ItemAudit:
    async def ask(stage: str, template: str, variables: dict[str, str], **kw: Any) -> Any:
        return await calls.ask(episode, item.turn, stage, template, variables, **kw)

    async with gate:
        if rewrite:  # the planting model's turn first: the auditor judges the item as planted
            item = await rewrite_item(spec, view, item, ask)
        return await judge_item(spec, view, item, ask)


async def judge_all(
    source: Run,
    items: Items,
    calls: CallService,
    concurrency: int,
    on_result: Callable[[PlantResult], None] | None = None,
    rewrite: bool = False,
) -> Results:
    """Every episode's items judged, all at once (at most `concurrency` items in flight); `rewrite`: each
    planted item rewritten by the planting model first (the narrator role of `calls`)."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def episode(name: str) -> PlantResult:
        result = source.results[name]
        spec = source.specs[result.spec_id]
        views = {v.record.turn: v for v in replay(spec, result).turns}
        audits = await asyncio.gather(*(_one(spec, views[i.turn], i, calls, name, gate, rewrite) for i in items[name]))
        return PlantResult(spec_id=result.spec_id, trial=result.trial, items=tuple(audits))

    return await each_episode(items, episode, on_result)
