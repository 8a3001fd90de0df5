"""Known-truth items for measuring an auditor: a finished run's clean turns, and the same turns with one
contradiction planted, one item per conflict type (PROTOCOL section 4's `fact`, `commitment`,
`player_input`).

A turn that committed with no standing conflict is a *clean* item: the run's auditor passed it (a
contradiction both that auditor and the judged one miss stays unseen, so the false-alarm rate measured
on these items is an upper bound). Each planted item is that turn's narration with one sentence
inserted, made by a fixed edit from the ledger the turn was told against:

- `fact`: an active fact of the projected ledger (what the audit sees) denied;
- `commitment`: a commitment pending before the turn, its violation condition told as happening now;
- `player_input`: the player's action ignored, its effect reversed.

Everything is drawn from one seed and the episode's name, so the items of a run are the same in every
process and for every auditor judged on them (an auditor sweep compares auditors on the same plants).
Where a planting model is configured (`plant.model`), each planted item is then rewritten by it
(`rewrite_item`): asked to weave the same contradiction into the narration, its answer is checked (the
planted words in its text and carrying what they contradict, the rest of the text the narration as played,
nearly word for word) and an answer that fails is replaced by the fixed edit, saying why.

The records here are what a plant directory seals (rundir/store.py), one `PlantResult` per episode.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import random
import re
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from . import ledger
from .episode import CallFailed, audit_response
from .narrators import Ask
from .reaudit import TurnAudit
from .records import EpisodeResult, Record
from .replay import TurnView, replay
from .spec import Spec
from .stages import CONFLICT_TYPES, PlantRewrite
from .trials import episode_name

CLEAN = "clean"
ItemKind = Literal["clean", "fact", "commitment", "player_input"]
PLACES = ("start", "end", "random")
Place = Literal["start", "end", "random"]

# Sentences open a first word capitalised only as the start of a sentence: lowered when a fact is
# quoted after "that" (a name keeps its capital).
_COMMON_OPENERS = frozenset("the a an there it this that these those your you his her their its some one".split())


class PlantedItem(Record):
    """One item: a turn's narration as played (`clean`) or with one contradiction planted."""

    item: str  # <episode>/t<turn id>/<kind>: unique in a run, the pairing key across auditors
    turn: int  # the source turn's id
    kind: ItemKind
    target: str = ""  # what the plant contradicts: a fact id, a commitment id, `input`; "" when clean
    at: int = 0  # where in `response` the planted words begin (characters)
    inserted: str = ""  # the exact planted text there (the fixed edit: the planted sentence and its space)
    response: str  # the narration the auditor judges
    # How it was planted: `edit`, the fixed sentence inserted; `model`, the planting model's rewrite, checked
    # (rewrite_item). `played`: the narration as played, kept when a rewrite changed more than the planted
    # words; `refused`: why the planting model's rewrite was not used (the item is then the fixed edit).
    by: Literal["edit", "model"] = "edit"
    played: str = ""
    refused: str = ""

    @property
    def planted(self) -> bool:
        return self.kind != CLEAN

    @property
    def sentence(self) -> str:
        return self.inserted.strip()

    @property
    def original(self) -> str:
        """The narration as played (the planted text taken out)."""
        return self.played or self.response[: self.at] + self.response[self.at + len(self.inserted) :]


class ItemAudit(Record):
    """An item and the judged auditor's verdict on it (steps 3-5, as a turn is judged)."""

    item: PlantedItem
    audit: TurnAudit

    @property
    def judged(self) -> bool:
        return self.audit.judged

    @property
    def flagged(self) -> bool:
        """A conflict stands after the double-check."""
        return bool(self.audit.conflicts)

    @property
    def types(self) -> frozenset[str]:
        return frozenset(c.type for c in self.audit.conflicts)

    @property
    def typed(self) -> bool:
        """A standing conflict has the planted type."""
        return self.item.kind in self.types

    @property
    def aimed(self) -> bool:
        """A standing conflict names the planted contradiction itself: its type and the id it contradicts (the
        fact, the commitment, `input`); another conflict of the right type is not it."""
        return any(c.type == self.item.kind and c.id == self.item.target for c in self.audit.conflicts)


class PlantResult(Record):
    """One episode's items and their verdicts: a plant directory's sealed record."""

    spec_id: str
    trial: int = Field(0, ge=0)
    items: tuple[ItemAudit, ...]

    @property
    def episode(self) -> str:
        return episode_name(self.spec_id, self.trial)


# ---- the plants -------------------------------------------------------------------------------------


def _unit(*parts: object) -> random.Random:
    key = "/".join(str(p) for p in parts).encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


def _clause(text: str) -> str:
    """A sentence read as a clause after "that": its closing stop dropped, a common opener lowered."""
    body = text.strip().rstrip(".!?").strip()
    first, _, rest = body.partition(" ")
    if first.lower() in _COMMON_OPENERS:
        body = first.lower() + (" " + rest if rest else "")
    return body


def fact_sentence(fact: str) -> str:
    return f"It is not true that {_clause(fact)}."


def commitment_sentence(violation: str) -> str:
    return f"And here, now, it happens: {_clause(violation)}."


def input_sentence(player_input: str) -> str:
    action = " ".join(player_input.split())
    if len(action) > 160:
        action = action[:157].rstrip() + "..."
    return f'None of what you attempt ("{action}") takes place; everything stays exactly as it was before you acted.'


_BOUNDARY = re.compile(r"(?<=[.!?])\s+")


def insertion_point(text: str, place: str, rng: random.Random) -> tuple[int, str, str]:
    """Where a sentence goes in `text` (start, end, or a sentence boundary drawn by `rng`), and the space
    before and after it."""
    if place == "start" or not text.strip():
        return 0, "", " " if text else ""
    if place == "end":
        return len(text.rstrip()), " ", ""
    cuts = [m.start() for m in _BOUNDARY.finditer(text.rstrip())]
    at = rng.choice([0, *cuts, len(text.rstrip())])
    if at == 0:
        return 0, "", " "
    return at, " ", ""


def plant(view: TurnView, spec: Spec, kind: str, place: str, rng: random.Random) -> tuple[str, str] | None:
    """(target id, sentence) of one plant on a committed turn, or None when the turn has nothing of that
    kind to contradict (no active fact, no pending commitment)."""
    rec = view.record
    if kind == "fact":
        facts = ledger.active_facts(view.projected)
        if not facts:
            return None
        f = rng.choice(list(facts))
        return f.id, fact_sentence(f.text)
    if kind == "commitment":
        status = view.before.status_map
        pending = [c for c in spec.commitments if status.get(c.id) == "pending"]
        if not pending:
            return None
        c = rng.choice(pending)
        return c.id, commitment_sentence(c.violation_condition)
    if kind == "player_input":
        return "input", input_sentence(rec.player_input)
    raise ValueError(f"no plant of kind {kind!r}")


def items_of_turn(
    episode: str, view: TurnView, spec: Spec, kinds: Sequence[str], place: str, seed: int
) -> list[PlantedItem]:
    """The clean item and one planted item per kind the turn can take (a kind it cannot is skipped)."""
    rec = view.record
    name = f"{episode}/t{rec.turn}"
    out = [PlantedItem(item=f"{name}/{CLEAN}", turn=rec.turn, kind=CLEAN, response=rec.response)]
    for kind in kinds:
        rng = _unit(seed, name, kind)
        made = plant(view, spec, kind, place, rng)
        if made is None:
            continue
        target, sentence = made
        at, before, after = insertion_point(rec.response, place, rng)
        inserted = before + sentence + after
        text = rec.response[:at] + inserted + rec.response[at:]
        out.append(
            PlantedItem(
                item=f"{name}/{kind}", turn=rec.turn, kind=kind, target=target, at=at, inserted=inserted, response=text
            )
        )
    return out


def clean_turns(spec: Spec, result: EpisodeResult) -> list[TurnView]:
    """The turns of an episode that committed with no standing conflict, each with its state."""
    return [v for v in replay(spec, result).turns if v.committed and not v.record.conflicts]


def draw_items(
    spec: Spec, result: EpisodeResult, kinds: Sequence[str], turns: int, place: str, seed: int
) -> list[PlantedItem]:
    """`turns` clean turns of one episode drawn at random (seeded by `seed` and the episode), each as
    its items; an episode with fewer clean turns gives all it has."""
    views = clean_turns(spec, result)
    episode = episode_name(result.spec_id, result.trial)
    picked = sorted(_unit(seed, episode, "turns").sample(range(len(views)), min(turns, len(views))))
    return [it for i in picked for it in items_of_turn(episode, views[i], spec, kinds, place, seed)]


def items_digest(items: Sequence[PlantedItem], planter: object = None) -> str:
    """The plants' identity by content: every item as drawn, and the planting model that rewrites them
    (None: the fixed edits alone, the digest as it was before planting models)."""
    doc: object = [i.model_dump(mode="json") for i in items]
    if planter is not None:
        doc = {"items": doc, "planter": planter}
    text = json.dumps(doc, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def unknown_kinds(kinds: Sequence[str]) -> list[str]:
    return [k for k in kinds if k not in CONFLICT_TYPES]


# ---- judging ----------------------------------------------------------------------------------------


def plant_key(item: PlantedItem) -> str:
    """The call key of an item's audit, `plant/<kind>[/<target>]`: each item draws seeds of its own
    (execution/calls.call_seed), and a scripted auditor reads its truth there (engines/scripted.py)."""
    return f"plant/{item.kind}/{item.target}" if item.planted else f"plant/{item.kind}"


async def judge_item(spec: Spec, view: TurnView, item: PlantedItem, ask: Ask) -> ItemAudit:
    """PROTOCOL section 3, steps 3-5, on the item's narration and the state the turn was told in: the
    same stages, double-check and grammar a turn's audit uses (episode.audit_response)."""

    async def keyed(stage: str, template: str, variables: dict[str, str], **kw: object) -> object:
        return await ask(stage, template, variables, key=plant_key(item), **kw)

    rec = view.record
    try:
        audit = await audit_response(spec, view.before, view.projected, rec.player_input, item.response, keyed)
    except CallFailed as exc:
        return ItemAudit(item=item, audit=TurnAudit(turn=rec.turn, error=str(exc)))
    return ItemAudit(item=item, audit=TurnAudit(turn=rec.turn, **audit.record_fields()))


# ---- planting by a model ----------------------------------------------------------------------------

# A rewrite is used only if the rest of its text (the planted words taken out) is the narration as played
# to this word-level similarity (difflib's ratio: 2 x matching words / all words), and its planted words
# carry this share of the content words of what they contradict (the fact, the violation, the action).
REWRITE_KEEP = 0.85
REWRITE_CARRY = 0.4
_WORD = re.compile(r"[\w']+")
_FILLER = frozenset(
    "the a an and or but of to in on at by for with from into onto as is are was were be been being it its "
    "this that these those you your he she they them his her their there here not no nor so than then".split()
)


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _content(text: str) -> set[str]:
    return {w for w in _words(text) if len(w) > 2 and w not in _FILLER}


def target_text(item: PlantedItem, view: TurnView, spec: Spec) -> str:
    """What the plant contradicts, in words: the fact's text, the commitment's violation, the player's action."""
    if item.kind == "fact":
        return next(f.text for f in ledger.active_facts(view.projected) if f.id == item.target)
    if item.kind == "commitment":
        return next(c.violation_condition for c in spec.commitments if c.id == item.target)
    return view.record.player_input


def contradiction(item: PlantedItem, target: str) -> str:
    """The mistake the planting model is asked to put in, described."""
    if item.kind == "fact":
        return f'An established fact is denied: the passage states that this is not so: "{target}"'
    if item.kind == "commitment":
        return f'A promise of the story is broken: this event, which must not happen, happens now: "{target}"'
    return (
        f'The player\'s action is ignored: the passage states that what they attempted ("{target}") does not '
        "happen, and that nothing changes because of it"
    )


def rewrite_vars(item: PlantedItem, view: TurnView, spec: Spec) -> dict[str, str]:
    """The `plant_rewrite` template's variables (stages.STAGES)."""
    return {
        "player_role": spec.meta.player_role,
        "user_input": view.record.player_input,
        "response_text": view.record.response,
        "contradiction": contradiction(item, target_text(item, view, spec)),
        "planted_sentence": item.sentence,
    }


def check_rewrite(played: str, text: str, planted: str, target: str) -> str:
    """Why a planting model's rewrite cannot stand for the plant ("" when it can)."""
    planted = planted.strip()
    if not planted or planted not in text:
        return "its planted words are not in its text"
    if planted in played:
        return "its planted words were in the narration already"
    rest = text.replace(planted, " ", 1)
    keep = difflib.SequenceMatcher(None, _words(played), _words(rest), autojunk=False).ratio()
    if keep < REWRITE_KEEP:
        return f"the rest of its text is not the narration as played (similarity {keep:.2f} < {REWRITE_KEEP})"
    wanted = _content(target)
    carry = len(wanted & _content(planted)) / len(wanted) if wanted else 1.0
    if carry < REWRITE_CARRY:
        return f"its planted words carry {carry:.0%} of what they contradict (< {REWRITE_CARRY:.0%})"
    return ""


def rewrite_key(item: PlantedItem) -> str:
    """The call key of an item's rewrite (apart from its audit's, plant_key)."""
    return f"rewrite/{item.kind}/{item.target}"


async def rewrite_item(spec: Spec, view: TurnView, item: PlantedItem, ask: Ask) -> PlantedItem:
    """The planted item as the planting model rewrites it, if its answer passes `check_rewrite`; else the
    fixed edit, with why in `refused`. A clean item is returned as it is."""
    if not item.planted:
        return item
    try:
        out = await ask("plant_rewrite", "plant_rewrite", rewrite_vars(item, view, spec), key=rewrite_key(item))
    except CallFailed as exc:
        return item.model_copy(update={"refused": f"no valid answer: {exc}"})
    assert isinstance(out, PlantRewrite)
    played = view.record.response
    why = check_rewrite(played, out.text, out.planted, target_text(item, view, spec))
    if why:
        return item.model_copy(update={"refused": why})
    planted = out.planted.strip()
    at = out.text.index(planted)
    made = {"by": "model", "response": out.text, "at": at, "inserted": planted, "played": played}
    return item.model_copy(update=made)
