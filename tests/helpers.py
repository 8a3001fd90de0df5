"""Shared builders for protocol tests: a small spec and a scripted run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli_runner import run_cli
from ncp_local.engines.base import Request
from ncp_local.engines.scripted import RandomPolicy, ScriptedEngine
from ncp_local.execution.calls import CallService, Pacer, RoleBinding, Sampling
from ncp_local.execution.scheduler import EpisodeScheduler, EpisodeSettings
from ncp_local.protocol.narrators import BaselineNarrator
from ncp_local.protocol.player import Player
from ncp_local.protocol.prompts import OPTIONAL, TEMPLATES, PromptPack
from ncp_local.protocol.spec import parse_spec
from ncp_local.rundir.call_log import CallLine, read_calls
from ncp_local.rundir.store import RunDir

# Nothing happens unless a rule says so: no conflicts, nodes, facts or satisfactions.
QUIET = RandomPolicy(conflict_rate=0, node_rate=0, satisfy_rate=0, add_fact_rate=0, negate_fact_rate=0)


def make_spec(
    spec_id: str = "tiny", n_facts: int = 3, n_nodes: int = 3, types: tuple[str, ...] = ("ordering", "achievement")
) -> Any:
    return parse_spec(spec_doc(spec_id, n_facts, n_nodes, types), Path(f"{spec_id}.yaml"), expected_id=spec_id)


def spec_doc(
    spec_id: str = "tiny", n_facts: int = 3, n_nodes: int = 3, types: tuple[str, ...] = ("ordering", "achievement")
) -> dict[str, Any]:
    """The spec file's content (what `make_spec` parses)."""
    return {
        "meta": {
            "id": spec_id,
            "title": f"Tiny {spec_id}",
            "genres": ["drama", "mystery"],
            "player_role": "a curious visitor",
        },
        "synopsis": "A visitor explores an old house.",
        "initial_facts": [
            {"id": f"f_{i}", "content": f"initial fact {i} of {spec_id}", "negated": False} for i in range(n_facts)
        ],
        "commitments": [
            {
                "id": f"c_{i}",
                "type": t,
                "description": f"commitment {i} of {spec_id}",
                "satisfaction_condition": f"sat {i}",
                "violation_condition": f"viol {i}",
            }
            for i, t in enumerate(types)
        ],
        "trajectory": [
            {
                "id": f"s_{i}",
                "description": f"node {i} description",
                "trigger_event": f"trigger {i}",
                "key_delta": f"delta {i}",
            }
            for i in range(n_nodes)
        ],
    }


def tag(req: Request) -> tuple[str, str, int, int]:
    t = req.tags
    return t["stage"], t["episode"], t["turn"], t["attempt"]


def prompt(req: Request) -> str:
    return "\n".join(m.content for m in req.messages)


def statuses(req: Request, satisfied: set[str]) -> str:
    items = req.json_schema["properties"]["statuses"]["prefixItems"]
    ids = [it["properties"]["id"]["const"] for it in items]
    return json.dumps(
        {"statuses": [{"id": i, "status": "SATISFIED" if i in satisfied else "PENDING", "reason": "r"} for i in ids]}
    )


def conflicts(items: list[tuple[str, str]], **extra: Any) -> str:
    return json.dumps({"conflicts": [{"type": t, "id": i, "reason": "r"} for t, i in items], **extra})


def first_check(items: list[tuple[str, str]] = (), reason: str = "r") -> dict[str, Any]:  # type: ignore[assignment]
    """A recorded first conflict check (protocol/records.py ConflictCheckRecord) of `items`, with its counts."""
    listed = [{"type": t, "id": i, "reason": reason} for t, i in items]
    counts = {t: sum(c["type"] == t for c in listed) for t in ("fact", "commitment", "player_input")}
    return {"conflicts": listed, "counts": {**counts, "total": len(listed)}}


def facts(add: list[str] = (), negate: list[str] = ()) -> str:  # type: ignore[assignment]
    return json.dumps({"add_facts": list(add), "negate_facts": list(negate), "reason": "r"})


def traj(hit: bool) -> str:
    return json.dumps({"trigger": {"occurred": hit, "reason": "r"}, "delta": {"occurred": hit, "reason": "r"}})


class Scripted:
    """Runs episodes on the scripted backend into a run directory."""

    def __init__(
        self,
        root: Path,
        specs: list[Any],
        rules: Callable[[Request], Any] | None = None,
        max_turns: int = 4,
        seed: int = 0,
        policy: RandomPolicy = QUIET,
        condition: str = "adversarial",
        concurrency: int = 64,
        narrator: Callable[[PromptPack, dict], Any] | None = None,
        pack_dir: Path | None = None,
        play_through: bool = False,
        bounds: dict[str, Any] | None = None,
        speculative_player: bool = False,
        failure_modes: bool = False,
        pacer: Pacer | None = None,
    ) -> None:
        self.root, self.specs, self.max_turns, self.seed = root, specs, max_turns, seed
        self.pacer = pacer
        self.failure_modes = failure_modes
        self.play_through = play_through
        self.speculative_player = speculative_player
        self.concurrency = concurrency
        self.backend = ScriptedEngine(rules=rules, policy=policy)
        self.condition = condition
        self.narrator = narrator or (lambda pack, roles: BaselineNarrator(pack))
        self.pack_dir = pack_dir
        self.bounds = bounds or {}  # role -> stages.Bounds (default: unbounded)

    def run(self) -> dict[str, Any]:
        pack = PromptPack.load(self.pack_dir, (*TEMPLATES, *OPTIONAL) if self.failure_modes else TEMPLATES)
        store = RunDir(self.root)
        store.open({"test": True}, identity="test")
        roles = {
            r: RoleBinding(
                self.backend, Sampling(), "scripted", **({"bounds": self.bounds[r]} if r in self.bounds else {})
            )
            for r in ("narrator", "player", "auditor")
        }
        scheduler = EpisodeScheduler(
            specs=tuple(self.specs),
            calls=CallService(roles=roles, pack=pack, store=store, seed=self.seed, pacer=self.pacer),
            store=store,
            settings=EpisodeSettings(
                max_turns=self.max_turns,
                concurrency=self.concurrency,
                play_through=self.play_through,
                speculative_player=self.speculative_player,
                failure_modes=self.failure_modes,
            ),
            make_narrator=lambda: self.narrator(pack, roles),
            player=Player(self.condition),
        )
        try:
            return asyncio.run(scheduler.run())
        finally:
            store.close()

    def calls(self) -> list[CallLine]:
        return read_calls(self.root / "calls.jsonl")

    def requests(self, stage: str, episode: str | None = None, turn: int | None = None) -> list[Request]:
        return [
            r
            for r in self.backend.requests
            if r.tags["stage"] == stage
            and (episode is None or r.tags["episode"] == episode)
            and (turn is None or r.tags["turn"] == turn)
        ]


def play_scripted_official(dataset: Path, out: Path, *extra: str) -> Path:
    """The official dataset played on the scripted engine for 15 turns into `out` (in-process, about 10 s),
    with `extra` overrides."""
    done = run_cli(
        "engine=scripted",
        "dataset=ncp_bench",
        f"dataset.path={dataset}",
        "max_turns=15",
        f"out_dir={out}",
        "progress=false",
        *extra,
    )
    assert done.returncode == 0, done.stderr
    return out


def headless_chromium(chromium: Path, profile: Path, *extra: str) -> list[str]:
    """A headless Chromium command line as this machine's closed network needs it (no background
    connections, no sync), with a fresh profile; `extra` adds the window size, the page and what to do."""
    return [
        str(chromium),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *extra,
    ]
