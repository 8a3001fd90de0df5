"""Small helpers shared by the engine tests."""

from __future__ import annotations

import functools
import socket
from dataclasses import dataclass
from pathlib import Path

from ncp_local.protocol import ROLES

ROOT = Path(__file__).resolve().parents[2]


# Output bounds for engine tests whose subject is not the shipped role files' sizes. The 135M model
# mostly loops inside a string until its bound ("1.1.1.1..."), about one token per character at about
# 11 tokens a second on 2 cores (fp32), so an episode's time is nearly its bounds' sum: the role files'
# 1,000-character narrations made a 2-turn episode take 4 minutes. Every bound keeps a value, so the
# grammar still bounds every field (and `bound_hits` still fires); tests/engine/test_rig_engine.py's
# `test_every_auditor_stage_parses_on_real_prompts` keeps the role files' own bounds.
# Halving them from the first small set (narration 80, reasons 40, two facts) shortened the openings and
# the player's lines; the status check's answer barely moved (its size is the JSON of one entry per
# commitment, hence FITS_COMMITMENTS below).
SMALL_BOUNDS: dict[str, dict[str, int]] = {
    "narrator": {"text_chars": 40, "reason_chars": 12, "subgoal_chars": 16, "summary_chars": 40},
    "player": {"player_chars": 30},
    "auditor": {
        "reason_chars": 12,
        "fact_chars": 30,
        "new_facts": 1,
        "negations": 1,
        "conflicts": 1,
        "build_chars": 30,
    },
}


def small_overrides(*roles: str) -> tuple[str, ...]:
    """SMALL_BOUNDS of these roles (every role if none is named) as command-line overrides."""
    return tuple(
        f"{role}.bounds.{key}={value}"
        for role in roles or tuple(SMALL_BOUNDS)
        for key, value in SMALL_BOUNDS[role].items()
    )


SMALL = small_overrides()

# The session's reference sweep (conftest `reference_sweep`): one batched sweep, every role in-process
# on the embedded model (one engine start), SMALL bounds, one turn (a second cost a minute of CI's 25),
# over the methods (baseline, hiagent), on a dataset of two specs (`reference_dataset`). The seed gives a
# baseline episode of FITS that commits turn 0 and plays turn 1 (test_mixed_engines asserts it).
REFERENCE = (
    "max_turns=1",
    "progress=false",
    "seed=0",
    *SMALL,
    *(f"+{role}.model.kv_cache_memory_bytes={1 << 30}" for role in ROLES),
)
METHODS = ("baseline", "hiagent")
# FITS plays: red_riding_hood with one commitment of each type (of its 8), since the status check
# answers one entry per commitment (about 20 tokens each, whatever the bounds: 8 made it the longest
# answer of a turn). CROWDED is treasure_island with 220 more established facts, whose opening prompt (about
# 11,500 tokens) overflows the embedded model's 8192-token window by the prompt itself (not by the
# output reservation), so it ends `context_limit` whether or not a backend clamps max_tokens to the
# room left (test_context_limit). FITS is first in the index: `limit=1` runs FITS alone.
FITS = "red_riding_hood"
FITS_COMMITMENTS = ("c_0", "c_2", "c_5")
CROWDED = "crowded_harbour"
CROWDING_FACTS = 220


def reference_dataset(root: Path) -> Path:
    """The reference sweep's dataset in `root`: FITS with FITS_COMMITMENTS, CROWDED built from treasure_island."""
    import yaml

    (root / "specs").mkdir(parents=True)
    src = ROOT / "specs" / "specs"
    fits = yaml.safe_load((src / f"{FITS}.yaml").read_text())
    fits["commitments"] = [c for c in fits["commitments"] if c["id"] in FITS_COMMITMENTS]
    assert {c["type"] for c in fits["commitments"]} == {"ordering", "invariant", "achievement"}
    (root / "specs" / f"{FITS}.yaml").write_text(yaml.safe_dump(fits, sort_keys=False))
    doc = yaml.safe_load((src / "treasure_island.yaml").read_text())
    doc["meta"]["id"] = CROWDED
    n = len(doc["initial_facts"])
    # About 45 tokens each.
    doc["initial_facts"] += [
        {
            "id": f"f_{n + i}",
            "negated": False,
            "content": f"Ledger entry {i} of the Admiral Benbow records that a traveller paid for supper, a bed and "
            f"stabling on night {i} of the winter, and left by the Bristol road at first light.",
        }
        for i in range(CROWDING_FACTS)
    ]
    (root / "specs" / f"{CROWDED}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (root / "index.yaml").write_text(yaml.safe_dump({"specs": [FITS, CROWDED]}))
    return root


@dataclass(frozen=True)
class ReferenceSweep:
    """The session's reference sweep, as run: its folder, index, output, and each method's run directory."""

    dataset: Path
    sweep_dir: Path
    index: dict
    stdout: str
    stderr: str

    def point(self, method: str) -> Path:
        return Path(self.index["points"][METHODS.index(method)]["run_dir"])


def alive_after(pids: list[int], timeout: float) -> list[int]:
    """Pids still running once `timeout` has passed (zombies count as gone)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    still = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                still.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return still


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stage_calls(spec, build: bool = True) -> list[tuple[str, str, dict[str, str], object, str | None]]:
    """One call per stage on real protocol state (after an opening and one exchange):
    (stage, template, variables, ids, extra template). Every schema feature the rig
    uses appears: bounded strings, enums built from state, anyOf/const, prefixItems."""
    from ncp_local.protocol import ledger
    from ncp_local.protocol.episode import audit_ids
    from ncp_local.protocol.ledger import Exchange, FactUpdate
    from ncp_local.protocol.prompts import (
        BUILD_TEMPLATES,
        conflict_vars,
        fact_update_vars,
        narrate_vars,
        opening_vars,
        player_vars,
        status_vars,
        to_json,
        trajectory_vars,
    )
    from ncp_local.protocol.stages import AuditIds

    state = ledger.initial_state(spec)
    opening = "You stand at the edge of the village with a basket on your arm."
    state = state.model_copy(update={"opening": opening, "pending": FactUpdate(add_facts=("The basket is full.",))})
    projected = ledger.projected_facts(state)
    player_input = "I walk straight to the forest and ask the first stranger for a shortcut."
    response = "You step under the trees. A grey wolf watches you from the path and asks where you are going."
    update = FactUpdate(add_facts=("A wolf is on the path.",))
    ids = audit_ids(spec, projected)
    seen = ledger.with_facts(state, projected)
    cvars = conflict_vars(spec, seen, player_input, response, update)
    after = state.model_copy(update={"exchanges": (Exchange(player_input=player_input, response=response),)})
    history = player_vars(spec, after)["history_text"]
    updated = ledger.with_facts(state, ledger.apply_update(projected, update))
    calls: list[tuple[str, str, dict[str, str], object, str | None]] = [
        ("opening", "opening", opening_vars(spec, ledger.initial_state(spec)), AuditIds(), None),
        ("narrate", "narrate", narrate_vars(spec, state, player_input, True), AuditIds(), None),
        (
            "hiagent_narrate",
            "hiagent_narrate",
            {**narrate_vars(spec, state, player_input), "working_memory": "(no subgoal yet)"},
            AuditIds(),
            "hiagent_memory",
        ),
        ("player", "player_adversarial", player_vars(spec, state), AuditIds(), None),
        ("player", "player_natural", player_vars(spec, state), AuditIds(), None),
        ("fact_update", "fact_update", fact_update_vars(spec, seen, response), ids, None),
        ("conflict_check", "conflict_check", cvars, ids, None),
        (
            "double_check",
            "double_check",
            {
                **cvars,
                "initial_conflicts_json": to_json(
                    [
                        {
                            "type": "commitment",
                            "id": spec.commitments[0].id,
                            "target_text": spec.commitments[0].description,
                            "reason": "the wolf appears before the story allows",
                        }
                    ]
                ),
            },
            ids,
            None,
        ),
        ("trajectory_check", "trajectory_check", trajectory_vars(spec, 0, updated, history), AuditIds(), None),
        (
            "status_check",
            "status_check",
            status_vars(spec, updated, state.node_occurred, history),
            AuditIds(commitment_ids=tuple(c.id for c in spec.commitments)),
            None,
        ),
    ]
    if build:
        variables = {
            "player_role": spec.meta.player_role,
            "synopsis": spec.synopsis,
            "reference_trajectory": "\n".join(f"[{n.id}] {n.description}" for n in spec.trajectory[:4]),
            "commitments": "\n".join(f"[{c.id}] ({c.type}) {c.description}" for c in spec.commitments[:3]),
        }
        calls += [(name, name, variables, AuditIds(), None) for name in BUILD_TEMPLATES]
    return calls


def call_role(stage: str) -> str:
    """The role whose binding answers `stage` here: the build stages' `builder` runs on the auditor's
    model, as `mode=build` binds it."""
    from ncp_local.protocol.stages import STAGES

    role = STAGES[stage].role
    return "auditor" if role == "builder" else role


def ask_all(engine_session, service, spec_id: str, calls, timeout: float = 1500) -> list:
    """Every call in flight at once through the call service (parse, bounds, retries, call log)."""
    import asyncio

    async def go() -> list:
        return await asyncio.gather(
            *(
                service.ask(
                    spec_id, 0, stage, template, variables, ids=ids, key=template, extra=extra, role=call_role(stage)
                )
                for stage, template, variables, ids, extra in calls
            )
        )

    return engine_session.run(go(), timeout=timeout)


def small_roles() -> dict:
    """embedded_roles() with SMALL_BOUNDS in place of the role files' bounds."""
    return {
        r: (sampling, bounds.model_copy(update=SMALL_BOUNDS[r])) for r, (sampling, bounds) in embedded_roles().items()
    }


def embedded_roles() -> dict:
    """{role: (Sampling, Bounds)} exactly as the default config's role files
    (conf/*/smollm2.yaml) give them, so engine tests never drift from what a
    user's run asks of the embedded model."""
    from ncp_local.execution.calls import Sampling

    cfg = default_config()
    return {
        r: (
            Sampling(getattr(cfg, r).temperature, getattr(cfg, r).top_p, getattr(cfg, r).max_tokens),
            getattr(cfg, r).bounds,
        )
        for r in ROLES
    }


@functools.cache
def default_config():  # type: ignore[no-untyped-def]
    """The default config (the embedded model in every role), validated."""
    from omegaconf import OmegaConf

    from ncp_local.config import compose, validate

    return validate(OmegaConf.to_container(compose(["dataset.path=specs"]), resolve=True))
