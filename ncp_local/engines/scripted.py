"""A backend that answers from a script: for protocol tests and dry runs.

It is never a stand-in for the engine in engine tests. Two ways to script:

- `rules`: a function `(request) -> str | Completion | None`; tests key it on
  `request.tags` (stage, episode, turn, attempt) to drive any branch of the
  protocol. Returning None falls through to the policy.
- `RandomPolicy`: seeded, schema-valid answers with tunable rates of
  conflicts, node completions and satisfied commitments, so that
  `engine=scripted` exercises every termination over a real dataset.

A known auditor (`PlantJudge`, mode=plant's simulations): on an item of mode=plant, whose kind and
planted target its call's `key` tag names (`plant/<kind>/<target>`: opaque to a real engine, read here
only because a scripted auditor's truth must be known), the conflict check finds a planted contradiction
of type t with chance `recall[t]` and names it with that type, citing the planted id, or with chance
`wrong_id[t]` another id of that type (when the state offers one); it flags a clean item with a conflict
of type u with chance `false_alarm[u]` (each type drawn on its own); the double-check confirms what the
first check found. So the figures mode=plant estimates have a known truth.

Fault injection (never a model's behaviour): simulated latency (`delay_s`), an engine that dies
after N calls (`die_after_calls`), and a window that fills (`context_limit_turn`): from that turn on,
the calls of a chosen share of the episodes no longer fit, so those episodes end `context_limit`
(censored) as a real model's would when its prompts outgrow its window.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .base import Completion, ContextOverflow, EngineDead, Request

Rule = Callable[[Request], "str | Completion | None"]


@dataclass(frozen=True)
class RandomPolicy:
    conflict_rate: float = 0.1
    overturn_rate: float = 0.3
    node_rate: float = 0.35
    satisfy_rate: float = 0.25
    add_fact_rate: float = 0.5
    negate_fact_rate: float = 0.15
    # Text lengths in characters (0: the short scripted texts, about 60-80 characters): a narration,
    # a player's line, an auditor's reason. A real narrator writes about 150 words a turn, a player
    # about 50, an auditor's reason about 20 (the plan's defaults, plan/growth.py Sizes).
    narration_chars: int = 0
    player_chars: int = 0
    reason_chars: int = 0

    def answer(self, request: Request) -> str:
        rng = random.Random(request.seed)
        stage = request.tags.get("stage", "")
        schema = request.json_schema or {}
        turn = request.tags.get("turn", 0)
        if stage == "player":
            line = f"I look around carefully and try something new (turn id {turn}, roll {rng.randint(1, 99)})."
            return _sized(line, self.player_chars, rng)
        if stage in ("opening", "narrate"):
            narration = _sized(
                f"You stand in the scene as it unfolds (turn id {turn}, beat {rng.randint(1, 99)}).",
                self.narration_chars,
                rng,
            )
            # A method's plain-text turn (an official method's call sent without grammar): HiAgent's
            # `Action:` form, which a plain narration also reads as.
            plain = stage == "narrate" and request.json_schema is None
            return f"Action: {narration}" if plain else json.dumps({"text": narration})
        reason = _sized("scripted", self.reason_chars, rng)  # draws from rng only when lengthened
        if stage == "hiagent_narrate":
            # A new subgoal every other turn, so summaries get exercised.
            return json.dumps(
                {
                    "subgoal": f"subgoal {max(turn, 0) // 2}",
                    "retrieve": None,
                    "text": f"You press on (turn id {turn}, beat {rng.randint(1, 99)}).",
                }
            )
        if stage == "hiagent_summarize":
            return json.dumps({"summary": f"Summary of what happened (roll {rng.randint(1, 99)})."})
        if stage == "plant_rewrite":  # a planting model with no skill: its rewrite fails mode=plant's check
            line = f"You notice nothing unusual (roll {rng.randint(1, 99)})."
            return json.dumps({"text": line, "planted": line})
        if stage == "build_trajectory":
            return json.dumps(
                {
                    "trajectory": [
                        {"description": f"beat {i}", "trigger_event": f"trigger {i}", "key_delta": f"change {i}"}
                        for i in range(4)
                    ]
                }
            )
        if stage == "build_commitments":
            return json.dumps(
                {
                    "commitments": [
                        {
                            "type": "achievement",
                            "description": "the story reaches s_3",
                            "satisfaction_condition": "s_3 occurs",
                            "violation_condition": "the story ends before s_3",
                        },
                        {
                            "type": "ordering",
                            "description": "s_0 happens before s_1",
                            "satisfaction_condition": "s_0 then s_1",
                            "violation_condition": "s_1 before s_0",
                        },
                    ]
                }
            )
        if stage == "build_facts":
            return json.dumps({"initial_facts": [{"content": f"fact {i}"} for i in range(3)]})
        if stage == "fact_update":
            enum = schema["properties"]["negate_facts"]["items"].get("enum", [])
            adds = [f"Something new is established at turn id {turn}."] if rng.random() < self.add_fact_rate else []
            negs = [rng.choice(enum)] if enum and rng.random() < self.negate_fact_rate else []
            return json.dumps({"add_facts": adds, "negate_facts": negs, "reason": reason})
        if stage in ("conflict_check", "double_check"):
            conflicts = []
            if stage == "double_check" or rng.random() < self.conflict_rate:
                branch = rng.choice(schema["properties"]["conflicts"]["items"]["anyOf"])
                props = branch["properties"]
                cid = props["id"].get("const") or rng.choice(props["id"]["enum"])
                conflicts.append({"type": props["type"]["const"], "id": cid, "reason": reason})
            out: dict[str, Any] = {"conflicts": conflicts}
            if stage == "double_check":
                out.update(confirmed=rng.random() >= self.overturn_rate, review_reason=reason)
            return json.dumps(out)
        if stage == "trajectory_check":
            hit = rng.random() < self.node_rate
            return json.dumps(
                {"trigger": {"occurred": hit, "reason": reason}, "delta": {"occurred": hit, "reason": reason}}
            )
        if stage == "status_check":
            items = schema["properties"]["statuses"]["prefixItems"]
            return json.dumps(
                {
                    "statuses": [
                        {
                            "id": it["properties"]["id"]["const"],
                            "status": "SATISFIED" if rng.random() < self.satisfy_rate else "PENDING",
                            "reason": reason,
                        }
                        for it in items
                    ]
                }
            )
        if stage == "failure_mode":
            items = schema["properties"]["modes"]["prefixItems"]
            return json.dumps(
                {
                    "modes": [
                        {
                            "conflict": it["properties"]["conflict"]["const"],
                            "mode": rng.choice(it["properties"]["mode"]["enum"]),
                            "reason": reason,
                        }
                        for it in items
                    ]
                }
            )
        if stage == "scaling":  # mode=bench's engine-alone measurement: any text of the asked length
            return "a" * (4 * request.max_tokens)
        raise ValueError(f"scripted backend: no policy for stage {stage!r}")


PLANT_KEY = "plant/"  # the call key of a mode=plant item's audit (protocol/plant.py plant_key)


@dataclass
class PlantJudge:
    """A scripted auditor of known recall and false-alarm rate per conflict type (module docstring)."""

    recall: dict[str, float]
    false_alarm: dict[str, float]
    wrong_id: dict[str, float] = field(default_factory=dict)  # of the plants found, named with another id
    # The first check's conflicts per (episode, turn, key): the double-check of the same item confirms them.
    found: dict[tuple[Any, Any, str], list[dict[str, str]]] = field(default_factory=dict)

    def answers(self, request: Request) -> bool:
        key = str(request.tags.get("key", ""))
        return key.startswith(PLANT_KEY) and request.tags.get("stage") in ("conflict_check", "double_check")

    def answer(self, request: Request) -> str:
        tags = request.tags
        where = (tags.get("episode"), tags.get("turn"), str(tags.get("key")))
        if tags["stage"] == "double_check":
            conflicts = self.found.pop(where, [])  # asked once per item: the memory goes with it
            return json.dumps({"conflicts": conflicts, "confirmed": True, "review_reason": "scripted"})
        kind, _, target = str(tags["key"])[len(PLANT_KEY) :].partition("/")
        rng = random.Random(request.seed)
        branches = {
            b["properties"]["type"]["const"]: b["properties"]
            for b in (request.json_schema or {})["properties"]["conflicts"]["items"]["anyOf"]
        }
        named = [kind] if rng.random() < self.recall.get(kind, 0.0) else []
        if kind not in self.recall:  # a clean item: each type may be flagged, on its own draw
            named = [t for t in sorted(self.false_alarm) if rng.random() < self.false_alarm[t]]
        conflicts = []
        for t in named:
            if t in branches:  # a type the state offers no id for cannot be named
                ids = branches[t]["id"]
                offered = [ids["const"]] if "const" in ids else list(ids["enum"])
                cited = rng.choice(offered)
                if t == kind and target in offered:  # the plant found: its own id, or another of its type
                    others = [i for i in offered if i != target]
                    wrong = others and rng.random() < self.wrong_id.get(t, 0.0)
                    cited = rng.choice(others) if wrong else target
                conflicts.append({"type": t, "id": cited, "reason": "scripted"})
        if conflicts:  # only these are double-checked
            self.found[where] = conflicts
        return json.dumps({"conflicts": conflicts})


# Filler for the sized texts: words cut from one fixed passage at a seeded offset (cheap: the
# rig-alone bench counts this engine's CPU with the rig's).
_FILLER = (
    "The lantern swings in the wind and the harbor bell rings twice while the ferryman counts his coins "
    "beside the cedar gate, and somewhere past the orchard a falcon circles above the marble tower where "
    "the old signal fire still smoulders in the copper bowl; the meadow is quiet, the river runs high "
    "with winter melt, and the thread of the story pulls the traveller on toward the violet hills. "
) * 8


def _sized(text: str, chars: int, rng: random.Random) -> str:
    """`text` lengthened with filler to about `chars` characters (unchanged when it is that long already)."""
    if chars <= len(text):
        return text
    start = rng.randrange(len(_FILLER) // 2)
    return f"{text} {_FILLER[start : start + chars - len(text) - 1].strip()}"


@dataclass(frozen=True)
class Overflow:
    """The window fills (fault injection): from the player turn `turn` on (turn N = the N-th player
    turn), every call of a chosen episode raises ContextOverflow, as a real engine's would."""

    turn: int
    share: float = 1.0  # of the episodes, chosen by their name (the same ones in every run and seed)

    def chosen(self, episode: str) -> bool:
        # A hash, not the run's seed: the same stories overflow whatever else a run changes.
        draw = int.from_bytes(hashlib.sha256(episode.encode()).digest()[:4], "big") / 2**32
        return draw < self.share

    def hits(self, request: Request) -> bool:
        turn = request.tags.get("turn")
        episode = request.tags.get("episode")
        if not isinstance(turn, int) or not isinstance(episode, str):
            return False
        # A request's turn is the record's id (the opening -1, player turn N is N - 1: protocol/turns.py,
        # which an engine does not import).
        return turn + 1 >= self.turn and self.chosen(episode)


class ScriptedEngine:
    def __init__(
        self,
        rules: Rule | None = None,
        policy: RandomPolicy | None = None,
        delay_s: float = 0.0,
        die_after_calls: int | None = None,
        overflow: Overflow | None = None,
        keep_requests: bool = True,
        plant: PlantJudge | None = None,
    ) -> None:
        self.rules = rules
        self.plant = plant
        self.policy = policy or RandomPolicy()
        # Every request, for the tests that read what was asked. A run's engine (`start`) keeps none: at
        # turn 100 each prompt is about 600 kB, and keeping them cost 17 MB per episode, which the bench
        # measuring the rig's memory would have charged to the rig.
        self.keep_requests = keep_requests
        self.requests: list[Request] = []
        self.calls = 0
        # Fault injection for reliability tests: simulated latency, and an
        # engine that dies after N calls (as a crashed engine process would).
        self.delay_s = delay_s
        self.die_after_calls = die_after_calls
        self.overflow = overflow

    async def generate(self, request: Request) -> Completion:
        if self.die_after_calls is not None and self.calls >= self.die_after_calls:
            raise EngineDead(f"scripted engine died after {self.die_after_calls} calls (fault injection)")
        self.calls += 1
        if self.keep_requests:
            self.requests.append(request)
        if self.overflow is not None and self.overflow.hits(request):
            await asyncio.sleep(self.delay_s)
            raise ContextOverflow(
                f"scripted engine: the window is full from turn {self.overflow.turn} "
                "(fault injection: engine.context_limit_turn)"
            )  # yield, as a real engine would, so episodes interleave
        # The answer is made before the yield, in the step that asked (which the rig paces), not after it,
        # where every episode the engine answers at once would make its own in the same loop pass.
        out = self.rules(request) if self.rules else None
        if out is None and self.plant is not None and self.plant.answers(request):
            out = self.plant.answer(request)
        if out is None:
            out = self.policy.answer(request)
        await asyncio.sleep(self.delay_s)
        if isinstance(out, Completion):
            return out
        prompt_chars = sum(len(m.content) for m in request.messages)
        return Completion(
            text=out, finish_reason="stop", prompt_tokens=prompt_chars // 4, generated_tokens=max(1, len(out) // 4)
        )

    async def close(self) -> None:
        return None


async def start(model: Any, engine: Any, endpoint: Any) -> ScriptedEngine:
    """The registry's start (engines/registry.py): the run's `engine=scripted` settings, or the
    defaults for a scripted role in a run whose top-level engine is another."""
    if getattr(engine, "name", None) != "scripted":
        return ScriptedEngine(policy=RandomPolicy(), keep_requests=False)
    return ScriptedEngine(
        keep_requests=False,
        policy=RandomPolicy(
            conflict_rate=engine.conflict_rate,
            overturn_rate=engine.overturn_rate,
            node_rate=engine.node_rate,
            satisfy_rate=engine.satisfy_rate,
            narration_chars=engine.narration_chars,
            player_chars=engine.player_chars,
            reason_chars=engine.reason_chars,
        ),
        delay_s=engine.delay_s,
        die_after_calls=engine.die_after_calls,
        overflow=(
            Overflow(engine.context_limit_turn, engine.context_limit_share)
            if engine.context_limit_turn is not None
            else None
        ),
        plant=PlantJudge(
            recall=dict(engine.plant_recall),
            false_alarm=dict(engine.plant_false_alarm),
            wrong_id=dict(engine.plant_wrong_id),
        ),
    )
