"""Prompt packs: one template per stage, rendered from protocol state.

A pack is a folder of `<stage>.txt` files (the player has one per condition:
`player_adversarial.txt`, `player_natural.txt`). Placeholders are `{name}`
with PROTOCOL section 8's names, so a pack of the official files can replace
ours; any other brace (JSON examples in a template) is left alone.

Layout (prefix caching): stages that see the same material read it in the
same order and in the same words, the task comes last. Every prompt that
sees the story's commitments and beats starts with them (one shared lead),
then its history, then the state that changes, then the item under audit,
then its own instructions. So the engine computes the material once per
episode, the status check reuses the narrator's prompt of the same turn,
the next narrator prompt reuses the status check's (the history through
the turn), the double-check reuses the whole conflict check; the player and
the trajectory check share their history the same way. Fewer distinct
prefixes also means fewer KV blocks to keep, which decides the hit rate
when the cache is small. The fact update (no history) keeps its
instructions first: its own previous prompt is all it can share with.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from .ledger import EpisodeState, FactEntry, FactUpdate, current_node
from .llm.base import Message
from .spec import Spec, SpecError

PLACEHOLDERS: tuple[str, ...] = (
    "player_role", "history_text", "system_response_history", "user_input", "response_text",
    "pre_turn_facts", "facts", "candidate_fact_updates", "current_node", "trajectory_progress",
    "narrative_commitments", "pending_fact_updates", "initial_conflicts_json", "synopsis",
    "reference_trajectory", "commitments",
    # The rig's own additions: the same content split into what never changes
    # in an episode (cacheable before the history) and what does.
    "commitment_definitions", "commitment_statuses", "trajectory_nodes", "trajectory_flags",
)
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "prompts"
TEMPLATES: tuple[str, ...] = (
    "opening", "narrate", "player_adversarial", "player_natural", "fact_update",
    "conflict_check", "double_check", "trajectory_check", "status_check",
)


@dataclass(frozen=True)
class PromptPack:
    root: Path
    templates: Mapping[str, str]

    @classmethod
    def load(cls, root: str | Path | None = None, required: Iterable[str] = TEMPLATES) -> "PromptPack":
        path = Path(root) if root else DEFAULT_DIR
        if not path.is_dir():
            raise SpecError(path, "prompts.dir", "not a directory")
        templates: dict[str, str] = {}
        for f in sorted(path.glob("*.txt")):
            templates[f.stem] = f.read_text(encoding="utf-8")
        missing = [name for name in required if name not in templates]
        if missing:
            raise SpecError(path, "prompts.dir", f"missing template(s): {', '.join(f'{m}.txt' for m in missing)}")
        return cls(path, templates)

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.templates):
            h.update(name.encode() + b"\0" + self.templates[name].encode() + b"\0")
        return h.hexdigest()

    def render(self, template: str, variables: Mapping[str, str], feedback: str = "") -> tuple[Message, ...]:
        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in variables:
                raise KeyError(f"template {template}.txt uses {{{name}}} which this stage does not provide")
            return variables[name]

        text = _PLACEHOLDER.sub(sub, self.templates[template]).strip()
        if feedback:
            # A re-ask after a failed cross-check goes last, after the item itself.
            text += f"\n\nYOUR PREVIOUS ANSWER WAS REJECTED. Fix these problems:\n{feedback}"
        return (Message("user", text),)


# ---- formatting of state into placeholder values -------------------------

NONE = "(none)"


def format_facts(facts: Iterable[FactEntry]) -> str:
    lines = [f"- [{f.id}] {f.text}" for f in facts if f.active]
    return "\n".join(lines) or NONE


def format_commitments(spec: Spec, status: Mapping[str, str] | None) -> str:
    """Each commitment with its conditions; with its status inline when `status` is given."""
    def head(cid: str, ctype: str) -> str:
        return f"({ctype}, status: {status.get(cid, 'pending')})" if status is not None else f"({ctype})"
    blocks = [f"[{c.id}] {head(c.id, c.type)} {c.description}\n  satisfied when: {c.satisfaction_condition}\n"
              f"  violated when: {c.violation_condition}" for c in spec.commitments]
    return "\n".join(blocks) or NONE


def format_commitment_statuses(spec: Spec, state: EpisodeState) -> str:
    status = state.status_map
    return ", ".join(f"{c.id}: {status.get(c.id, 'pending')}" for c in spec.commitments) or NONE


def format_nodes(spec: Spec) -> str:
    return "\n".join(f"[{n.id}] {n.description}" for n in spec.trajectory)


def format_flags(spec: Spec, occurred: tuple[bool, ...]) -> str:
    return ", ".join(f"{n.id}: {'occurred' if done else 'not yet'}" for n, done in zip(spec.trajectory, occurred))


def story_vars(spec: Spec, state: EpisodeState, occurred: tuple[bool, ...]) -> dict[str, str]:
    """Commitments and trajectory, both whole (official names) and split static/changing."""
    return {
        "narrative_commitments": format_commitments(spec, state.status_map),
        "trajectory_progress": format_trajectory(spec, occurred),
        "commitment_definitions": format_commitments(spec, None),
        "commitment_statuses": format_commitment_statuses(spec, state),
        "trajectory_nodes": format_nodes(spec),
        "trajectory_flags": format_flags(spec, occurred),
    }


def format_trajectory(spec: Spec, occurred: tuple[bool, ...]) -> str:
    return "\n".join(
        f"[{n.id}] ({'occurred' if done else 'not yet'}) {n.description}"
        for n, done in zip(spec.trajectory, occurred))


def format_node(spec: Spec, index: int, with_description: bool = True) -> str:
    n = spec.trajectory[index]
    head = f"[{n.id}] {n.description}\n" if with_description else f"[{n.id}]\n"
    return f"{head}  trigger event: {n.trigger_event}\n  key change: {n.key_delta}"


def format_history(opening: str, exchanges: Iterable[tuple[str, str]]) -> str:
    parts = [f"NARRATOR: {opening}"]
    for player_input, response in exchanges:
        parts.append(f"PLAYER: {player_input}")
        parts.append(f"NARRATOR: {response}")
    return "\n\n".join(parts)


def format_responses(opening: str, responses: Iterable[str]) -> str:
    return "\n\n".join(f"[{i}] {r}" for i, r in enumerate([opening, *responses]))


def format_update(update: FactUpdate, facts: Iterable[FactEntry]) -> str:
    text = {f.id: f.text for f in facts}
    lines = [f"+ add: {a}" for a in update.add_facts if a.strip()]
    lines += [f"- negate [{i}] {text.get(i, '(unknown)')}" for i in update.negate_facts]
    return "\n".join(lines) or NONE


def to_json(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=1)


# ---- what each stage sees (PROTOCOL section 3) ----------------------------
# Each builder returns the placeholder values for one stage; templates pick
# what they use. History strings only ever grow at the end between turns.


def opening_vars(spec: Spec, state: EpisodeState) -> dict[str, str]:
    return {
        "player_role": spec.meta.player_role,
        "current_node": format_node(spec, 0),
        **story_vars(spec, state, state.node_occurred),
        "facts": format_facts(state.facts),
    }


def player_vars(spec: Spec, state: EpisodeState) -> dict[str, str]:
    # The player sees its role and the visible history, nothing else.
    return {
        "player_role": spec.meta.player_role,
        "history_text": format_history(state.opening, ((e.player_input, e.response) for e in state.exchanges)),
    }


def narrate_vars(spec: Spec, state: EpisodeState, player_input: str) -> dict[str, str]:
    return {
        "player_role": spec.meta.player_role,
        "history_text": format_history(state.opening, ((e.player_input, e.response) for e in state.exchanges)),
        **story_vars(spec, state, state.node_occurred),
        "current_node": format_node(spec, current_node(state.node_occurred)),
        "facts": format_facts(state.facts),
        "pending_fact_updates": format_update(state.pending, state.facts),
        "user_input": player_input,
    }


def fact_update_vars(projected: tuple[FactEntry, ...], response: str) -> dict[str, str]:
    # No history and no player input: the auditor judges the passage alone.
    facts = format_facts(projected)
    return {"pre_turn_facts": facts, "facts": facts, "response_text": response}


def conflict_vars(spec: Spec, state: EpisodeState, projected: tuple[FactEntry, ...], player_input: str,
                  response: str, update: FactUpdate) -> dict[str, str]:
    return {
        "player_role": spec.meta.player_role,
        "system_response_history": format_responses(state.opening, (e.response for e in state.exchanges)),
        "user_input": player_input,
        "response_text": response,
        "candidate_fact_updates": format_update(update, projected),
        **story_vars(spec, state, state.node_occurred),
        "current_node": format_node(spec, current_node(state.node_occurred)),
        "facts": format_facts(projected),
        "pre_turn_facts": format_facts(projected),
    }


def end_of_turn_history(state: EpisodeState, player_input: str, response: str) -> str:
    pairs = [(e.player_input, e.response) for e in state.exchanges] + [(player_input, response)]
    return format_history(state.opening, pairs)


def trajectory_vars(spec: Spec, node_index: int, facts: tuple[FactEntry, ...], history: str) -> dict[str, str]:
    # The node is shown without its description: only trigger and key change count.
    return {"history_text": history, "facts": format_facts(facts),
            "current_node": format_node(spec, node_index, with_description=False)}


def status_vars(spec: Spec, state: EpisodeState, facts: tuple[FactEntry, ...], occurred: tuple[bool, ...],
                history: str) -> dict[str, str]:
    return {"history_text": history, "facts": format_facts(facts),
            **story_vars(spec, state, occurred)}
