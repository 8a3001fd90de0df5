"""Build environments from synopses with three dependent calls (PROTOCOL section 7).

trajectory -> commitments (given the trajectory) -> initial facts (given
both). Each answer is grammar-constrained; what a grammar cannot check
(commitments naming nodes that exist, at least one achievement, the whole
spec passing the loader) is validated across parts, and a failing stage is
asked again with the errors, up to `rounds` times. Output is the official
format (index + specs/), so `mode=lint` accepts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config import ConfigError, RunConfig
from ..errors import InputError, shown
from ..execution.calls import CallService, with_engines
from ..execution.engine_pool import EnginePool
from ..execution.preflight import preflight
from ..exits import EXIT_FAILED, EXIT_OK
from ..protocol.episode import CallFailed
from ..protocol.prompts import BUILD_TEMPLATES
from ..protocol.spec import (
    ID_RULE,
    NODE_REF,
    Meta,
    Reader,
    is_plain_id,
    lint_spec,
    parse_spec,
    read_meta,
    read_yaml,
    unique,
)
from ..protocol.stages import BuiltCommitments, BuiltFacts, BuiltTrajectory
from ..rundir import identity, provenance
from ..rundir.atomic import atomic_write
from ..rundir.call_log import CrossCheckNote
from ..rundir.places import check_destination
from ..rundir.store import RunDir

ROUNDS = 3


@dataclass(frozen=True)
class Source:
    """What a spec is built from: its meta and a synopsis."""

    meta: Meta
    synopsis: str

    @property
    def id(self) -> str:
        return self.meta.id


def load_sources(path: str | Path) -> list[Source]:
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "sources", "no such file" if not path.exists() else "not a file: give FILE.yaml")
    r = Reader(path)
    data = read_yaml(path)
    items = data.get("sources") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise InputError(path, "sources", "expected a non-empty list of sources (or a mapping with `sources:`)")
    out = [
        Source(read_meta(r, item, f"sources[{i}]"), r.text(item, "synopsis", f"sources[{i}].synopsis"))
        for i, item in enumerate(items)
    ]
    unique(r, out, "sources")
    return out


def _trajectory_text(nodes: list[dict[str, str]]) -> str:
    return "\n".join(
        f"[{n['id']}] {n['description']} (trigger: {n['trigger_event']}; change: {n['key_delta']})" for n in nodes
    )


def _commitments_text(cs: list[dict[str, str]]) -> str:
    return "\n".join(f"[{c['id']}] ({c['type']}) {c['description']}" for c in cs)


def check_commitments(cs: list[dict[str, str]], node_ids: set[str]) -> list[str]:
    errors = []
    for c in cs:
        text = " ".join((c["description"], c["satisfaction_condition"], c["violation_condition"]))
        missing = sorted(set(NODE_REF.findall(text)) - node_ids)
        if missing:
            errors.append(
                f"{c['id']} names beats that do not exist: {', '.join(missing)} "
                f"(valid: {', '.join(sorted(node_ids, key=lambda s: int(s[2:])))})"
            )
    if not any(c["type"] == "achievement" for c in cs):
        errors.append("there must be at least one achievement commitment")
    return errors


def _blank(items: Sequence[Mapping[str, object]], what: str) -> list[str]:
    return [f"{what} {it['id']}: field {k} is blank" for it in items for k, v in it.items() if not str(v).strip()]


class Builder:
    def __init__(self, calls: CallService) -> None:
        self.calls = calls

    async def _stage(self, source: Source, stage: str, variables: dict[str, str], check: Any) -> Any:
        feedback = ""
        for round_ in range(ROUNDS):
            out = await self.calls.ask(
                source.id,
                0,
                stage,
                stage,
                variables,
                role="auditor",
                key=f"round{round_}" if round_ else "",
                feedback=feedback,
            )
            items, errors = check(out)
            if not errors:
                return items
            feedback = "\n".join(f"- {e}" for e in errors)
            self.calls.store.log_call(
                CrossCheckNote(spec_id=source.id, stage=stage, round=round_, cross_check_errors=tuple(errors))
            )
        raise InputError(source.id, stage, f"still invalid after {ROUNDS} rounds: {feedback}")

    async def build(self, source: Source) -> dict[str, Any]:
        base = {"synopsis": source.synopsis, "player_role": source.meta.player_role}

        def nodes_check(out: BuiltTrajectory) -> tuple[list[dict[str, str]], list[str]]:
            nodes = [{"id": f"s_{i}", **n.model_dump()} for i, n in enumerate(out.trajectory)]
            return nodes, _blank(nodes, "node")

        nodes = await self._stage(source, "build_trajectory", base, nodes_check)
        node_ids = {n["id"] for n in nodes}
        with_traj = {**base, "reference_trajectory": _trajectory_text(nodes)}

        def commitments_check(out: BuiltCommitments) -> tuple[list[dict[str, str]], list[str]]:
            cs = [{"id": f"c_{i}", **c.model_dump()} for i, c in enumerate(out.commitments)]
            return cs, _blank(cs, "commitment") + check_commitments(cs, node_ids)

        commitments = await self._stage(source, "build_commitments", with_traj, commitments_check)

        def facts_check(out: BuiltFacts) -> tuple[list[dict[str, Any]], list[str]]:
            fs = [{"id": f"f_{i}", "content": f.content, "negated": False} for i, f in enumerate(out.initial_facts)]
            return fs, _blank(fs, "fact")

        facts = await self._stage(
            source, "build_facts", {**with_traj, "commitments": _commitments_text(commitments)}, facts_check
        )
        m = source.meta
        doc = {
            "meta": {"id": m.id, "title": m.title, "genres": list(m.genres), "player_role": m.player_role},
            "synopsis": source.synopsis,
            "initial_facts": facts,
            "commitments": commitments,
            "trajectory": nodes,
        }
        # The assembled spec must pass the loader and lint clean.
        spec = parse_spec(doc, Path(f"{source.id}.yaml"), expected_id=source.id)
        warnings = lint_spec(spec, f"{source.id}.yaml")
        if warnings:
            raise InputError(source.id, "build", "; ".join(str(w) for w in warnings))
        return doc


def existing_index(out: Path, sources: Sequence[Source] = ()) -> list[str]:
    """The spec ids an earlier build put in `out/index.yaml` ([] for a new folder); the folder is
    checked first (a folder, writable, `specs/` a folder, each source's spec file not a folder,
    the index a dataset index), so a build that could not write its output is refused before
    its first model call."""
    check_destination(out, "out")
    if (out / "specs").exists() and not (out / "specs").is_dir():
        raise InputError(out / "specs", "out", "a file where the build writes its specs folder; move it away")
    for src in sources:
        target = out / "specs" / f"{src.id}.yaml"
        if target.is_dir():
            # Found after the model calls, this would lose the built spec at its atomic write.
            raise InputError(target, "out", "a folder where the build writes this spec; move it away")
    index_path = out / "index.yaml"
    if not index_path.exists():
        return []
    if not index_path.is_file():
        raise InputError(index_path, "out", "a folder where the build writes its index; move it away")
    data = read_yaml(index_path)
    what = "not a dataset index (`specs: [id, ...]`); give out= a new folder or one a build wrote"
    if not isinstance(data, dict):
        raise InputError(index_path, "out", f"{what} (the file holds a {type(data).__name__})")
    ids = data.get("specs", [])
    if not isinstance(ids, list):
        raise InputError(index_path, "specs", f"{what} (specs is a {type(ids).__name__})")
    for i, sid in enumerate(ids):
        if not isinstance(sid, str) or not is_plain_id(sid):
            raise InputError(index_path, f"specs[{i}]", f"{shown(sid)} is not a plain spec id ({ID_RULE})")
    return ids


async def build_all(calls: CallService, sources: list[Source], out: Path) -> dict[str, str]:
    """Builds every source; writes each spec as it completes, the index last."""
    builder = Builder(calls)
    status: dict[str, str] = {}

    async def one(src: Source) -> None:
        try:
            doc = await builder.build(src)
        except (InputError, CallFailed) as exc:
            status[src.id] = f"failed: {exc}"
            return
        atomic_write(
            out / "specs" / f"{src.id}.yaml", yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)
        )
        status[src.id] = "ok"

    await asyncio.gather(*(one(s) for s in sources))
    # Keep what an earlier build put in the index, then add this build's specs.
    index_path = out / "index.yaml"
    old = existing_index(out)
    built = [s.id for s in sources if status[s.id] == "ok"]
    ids = list(dict.fromkeys([i for i in old if (out / "specs" / f"{i}.yaml").exists()] + built))
    atomic_write(index_path, yaml.safe_dump({"specs": ids}, sort_keys=False))
    return status


def main(cfg: RunConfig) -> int:
    """`mode=build sources=FILE.yaml out=DIR`: specs from synopses, on the auditor's model."""
    if not cfg.sources:
        raise ConfigError("sources", "mode=build needs sources=FILE.yaml (id, title, genres, player_role, synopsis)")
    if not cfg.out:
        raise ConfigError("out", "mode=build needs out=DIR for the built specs")
    sources_file, out_dir = cfg.sources, cfg.out
    sources = load_sources(sources_file)
    ready = preflight(cfg, episodes=False, templates=BUILD_TEMPLATES)
    cfg, pack = ready.cfg, ready.pack
    engines = EnginePool(ready.bindings, endpoints=ready.endpoints)
    out = Path(out_dir).expanduser()
    existing_index(out, sources)  # before anything is written or any model called
    store = RunDir(out / ".build")
    store.open(
        {"config": cfg.source, "sources": str(sources_file), **provenance.environment()},
        identity.of_build(cfg, pack.templates, sources_file, ready.endpoints),
    )

    async def go() -> dict[str, str]:
        started = await engines.start()
        try:
            calls = CallService(
                roles=with_engines(ready.bindings, started, ("auditor",)), pack=pack, store=store, seed=cfg.seed
            )
            return await build_all(calls, sources, out)
        finally:
            await engines.close_all()

    try:
        status = asyncio.run(go())
    finally:
        store.close()
    for sid, st in status.items():
        print(f"{sid}: {st}")
    built = sum(st == "ok" for st in status.values())  # a failed spec is not written: say how many were
    print(f"{built} of {len(status)} spec(s) written to {out} (check with: python run.py mode=lint dataset.path={out})")
    return EXIT_OK if all(st == "ok" for st in status.values()) else EXIT_FAILED
