"""The registry: one `Stage` per stage, with its role, templates and placeholders, output and room."""

from __future__ import annotations

from dataclasses import dataclass

from ._base import AuditIds, Role, _bound_names, _Out, _sized
from ._outputs import (
    BuiltCommitments,
    BuiltFacts,
    BuiltTrajectory,
    ConflictCheckOut,
    DoubleCheckOut,
    FactUpdateOut,
    FailureModesOut,
    HiAgentStep,
    Narration,
    PlantRewrite,
    StatusOut,
    Summary,
    TrajectoryOut,
)

# ---- the registry ---------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A prompt template (`<name>.txt` in a pack) and the placeholders it may use:
    exactly the keys its builder (prompts.py's `*_vars`, hiagent.py, build.py) provides."""

    name: str
    placeholders: frozenset[str]
    fallback: str | None = None  # a template a pack may leave this one out for


def _template(name: str, *placeholders: str, fallback: str | None = None) -> Template:
    return Template(name, frozenset(placeholders), fallback)


@dataclass(frozen=True)
class Stage:
    """One stage of the protocol: everything the rig needs to ask it and to check its answers."""

    name: str
    role: Role
    # The answer's shape; its schema, bounds and checks are read off its fields.
    # None: the player's plain text, one line under `plain_bound`.
    output: type[_Out] | None
    templates: tuple[Template, ...]  # the player: one per condition; HiAgent: its memory block too
    # The least output room in tokens a compliant answer needs; with less the call cannot
    # succeed whatever the model does, and the episode ends `context_limit`.
    min_room: int
    room_per_commitment: int = 0
    plain_bound: str | None = None
    method: str | None = None  # a narrator method's own stage: asked for by its class, not every run
    # An analysis stage a run asks only when turned on (audit.failure_modes): not in what every
    # run reads, so a pack without its template still loads and the run's identity is unchanged.
    optional: bool = False

    @property
    def json(self) -> bool:
        return self.output is not None

    @property
    def bound_names(self) -> tuple[str, ...]:
        """The `Bounds` fields that apply to this stage's answers."""
        if self.output is None:
            return (self.plain_bound,) if self.plain_bound else ()
        return tuple(dict.fromkeys(_bound_names(self.output)))

    @property
    def size(self) -> tuple[int, int] | None:
        """mode=build: how many items the answer's list may have."""
        sized = _sized(self.output) if self.output is not None else iter(())
        return next(((s.lo, s.hi) for _, s in sized), None)


# Placeholders shared by several templates (PROTOCOL section 3).
_NARRATOR = (
    "player_role",
    "current_node",
    "narrative_commitments",
    "commitment_definitions",
    "commitment_statuses",
    "pre_turn_facts",
    "facts",
)
_NARRATE = (*_NARRATOR, "pending_fact_updates", "system_response_history", "user_input")
_AUDIT_STORY = (
    "narrative_commitments",
    "commitment_definitions",
    "commitment_statuses",
    "trajectory_progress",
    "trajectory_nodes",
    "trajectory_flags",
)
_CONFLICT = (
    "player_role",
    "system_response_history",
    "user_input",
    "response_text",
    "candidate_fact_updates",
    "current_node",
    "pre_turn_facts",
    "facts",
    *_AUDIT_STORY,
)
_PLAYER = ("player_role", "history_text")
MIN_ROOM_PER_COMMITMENT = 24  # a status entry

STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage("opening", "narrator", Narration, (_template("opening", *_NARRATOR),), min_room=128),
        Stage("narrate", "narrator", Narration, (_template("narrate", *_NARRATE),), min_room=128),
        Stage(
            "player",
            "player",
            None,
            (_template("player_adversarial", *_PLAYER), _template("player_natural", *_PLAYER)),
            min_room=32,
            plain_bound="player_chars",
        ),
        Stage(
            "fact_update",
            "auditor",
            FactUpdateOut,
            (_template("fact_update", "player_role", "pre_turn_facts", "facts", "response_text"),),
            min_room=64,
        ),
        Stage("conflict_check", "auditor", ConflictCheckOut, (_template("conflict_check", *_CONFLICT),), min_room=32),
        Stage(
            "double_check",
            "auditor",
            DoubleCheckOut,
            (_template("double_check", *_CONFLICT, "initial_conflicts_json"),),
            min_room=48,
        ),
        Stage(
            "failure_mode",
            "auditor",
            FailureModesOut,
            (_template("failure_mode", *_CONFLICT, "standing_conflicts_json"),),
            min_room=48,
            optional=True,
        ),
        # mode=plant with a planting model (plant.model): a planted turn rewritten, on the narrator's model.
        Stage(
            "plant_rewrite",
            "narrator",
            PlantRewrite,
            (
                _template(
                    "plant_rewrite", "player_role", "user_input", "response_text", "contradiction", "planted_sentence"
                ),
            ),
            min_room=128,
            optional=True,
        ),
        Stage(
            "trajectory_check",
            "auditor",
            TrajectoryOut,
            (_template("trajectory_check", "player_role", "history_text", "facts", "current_node"),),
            min_room=48,
        ),
        Stage(
            "status_check",
            "auditor",
            StatusOut,
            (_template("status_check", "player_role", "history_text", "facts", *_AUDIT_STORY),),
            min_room=32,
            room_per_commitment=MIN_ROOM_PER_COMMITMENT,
        ),
        # HiAgent's memory block is appended to its narrator prompt (PromptPack.render's `extra`);
        # a pack without `hiagent_narrate` lends it the baseline's narrator template.
        Stage(
            "hiagent_narrate",
            "narrator",
            HiAgentStep,
            (
                _template("hiagent_narrate", *_NARRATE, fallback="narrate"),
                _template("hiagent_memory", "player_role", "working_memory"),
            ),
            min_room=160,
            method="hiagent",
        ),
        Stage(
            "hiagent_summarize",
            "narrator",
            Summary,
            (_template("hiagent_summarize", "subgoal", "history_text"),),
            min_room=96,
            method="hiagent",
        ),
        Stage(
            "build_trajectory",
            "builder",
            BuiltTrajectory,
            (_template("build_trajectory", "player_role", "synopsis"),),
            min_room=256,
        ),
        Stage(
            "build_commitments",
            "builder",
            BuiltCommitments,
            (_template("build_commitments", "player_role", "synopsis", "reference_trajectory"),),
            min_room=256,
        ),
        Stage(
            "build_facts",
            "builder",
            BuiltFacts,
            (_template("build_facts", "player_role", "synopsis", "reference_trajectory", "commitments"),),
            min_room=256,
        ),
    )
}

# Views of the registry.
# mode=build: how many nodes / commitments / facts a built spec may have.
BUILD_SIZES: dict[str, tuple[int, int]] = {s.name: s.size for s in STAGES.values() if s.size is not None}
MIN_ROOM: dict[str, int] = {s.name: s.min_room for s in STAGES.values()}


def _stage(name: str) -> Stage:
    try:
        return STAGES[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}") from None


def method_templates(method: str) -> tuple[str, ...]:
    """The templates of a narrator method's own stages (what its class asks a pack for)."""
    return tuple(t.name for s in STAGES.values() if s.method == method for t in s.templates)


def min_room(stage: str, ids: AuditIds) -> int:
    """The least output room in tokens this call's compliant answer needs."""
    s = _stage(stage)
    return s.min_room + s.room_per_commitment * len(ids.commitment_ids)
