"""The stage registry: per stage, who answers it, its templates, its answer's shape and checks.

PROTOCOL section 4. `STAGES` holds one `Stage` per stage (its role, its
templates and their placeholders, its output model, its minimum output room);
prompts.py's template tables and the grammar are views of it, so adding a
stage is one entry in `_registry.STAGES` plus its template file in `prompts/`.

Each JSON schema is built per call by walking the stage's output model, whose
fields say which bound caps them and which ids of the call they may name
(`Bound`, `Names`, ...): whatever a grammar admits is valid in form wherever
JSON Schema can say it (conflict types and statuses are enums, `status_check`
has exactly one entry per commitment in spec order, strings and lists are
bounded, free text starts with a character the parser would not strip). Ids
are enums of the state under audit, or, as the engine layer chooses for a
backend that compiles slowly, patterns of their shapes (`IdForm`): the schema
is then the same on every call and the parser's existence check rejects an id
that does not exist. What a schema cannot say is checked after parsing; any
failure is an `InvalidOutput`, i.e. one failed attempt.

The package face: its parts are `_base` (roles, ids, bounds and the field markers), `_outputs` (the
answer models), `_schema` (the schema walker), `_registry` (`STAGES`) and `_parse` (parsing and checks).
"""

from ._base import (
    BLANK_CHARS,
    CONFLICT_TYPES,
    ID_FORMS,
    INTERNAL_ID,
    NON_BLANK_START,
    PLAYER_INPUT_ALIASES,
    PLAYER_INPUT_ID,
    TIGHT,
    UNBOUNDED,
    AuditIds,
    Bound,
    Bounds,
    ConflictType,
    FirstIs,
    IdForm,
    InvalidOutput,
    Names,
    NamesPer,
    OnePerName,
    Role,
    Size,
    conflict_targets,
)
from ._outputs import (
    COUNT_KEYS,
    FAILURE_MODES,
    BuildText,
    BuiltCommitment,
    BuiltCommitments,
    BuiltFact,
    BuiltFacts,
    BuiltNode,
    BuiltTrajectory,
    Conflict,
    ConflictCheckOut,
    DoubleCheckOut,
    FactUpdateOut,
    FailureMode,
    FailureModesOut,
    HiAgentStep,
    ModeEntry,
    Narration,
    Occurrence,
    PlantRewrite,
    Reason,
    StatusEntry,
    StatusOut,
    Summary,
    TrajectoryOut,
    conflict_name,
    count_conflicts,
)
from ._parse import PLAYER_LABELS, bound_hits, check_bounds, clean_player_text, parse
from ._registry import (
    BUILD_SIZES,
    MIN_ROOM,
    MIN_ROOM_PER_COMMITMENT,
    STAGES,
    Stage,
    Template,
    method_templates,
    min_room,
)
from ._schema import id_pattern, regex_for, schema_for

__all__ = [
    "AuditIds",
    "BLANK_CHARS",
    "BUILD_SIZES",
    "Bound",
    "Bounds",
    "BuildText",
    "BuiltCommitment",
    "BuiltCommitments",
    "BuiltFact",
    "BuiltFacts",
    "BuiltNode",
    "BuiltTrajectory",
    "CONFLICT_TYPES",
    "COUNT_KEYS",
    "Conflict",
    "ConflictCheckOut",
    "ConflictType",
    "DoubleCheckOut",
    "FAILURE_MODES",
    "FactUpdateOut",
    "FailureMode",
    "FailureModesOut",
    "FirstIs",
    "HiAgentStep",
    "ID_FORMS",
    "INTERNAL_ID",
    "IdForm",
    "InvalidOutput",
    "MIN_ROOM",
    "MIN_ROOM_PER_COMMITMENT",
    "ModeEntry",
    "NON_BLANK_START",
    "Names",
    "NamesPer",
    "Narration",
    "PlantRewrite",
    "Occurrence",
    "OnePerName",
    "PLAYER_INPUT_ALIASES",
    "PLAYER_INPUT_ID",
    "PLAYER_LABELS",
    "Reason",
    "Role",
    "STAGES",
    "Size",
    "Stage",
    "StatusEntry",
    "StatusOut",
    "Summary",
    "TIGHT",
    "Template",
    "TrajectoryOut",
    "UNBOUNDED",
    "bound_hits",
    "check_bounds",
    "clean_player_text",
    "conflict_name",
    "count_conflicts",
    "conflict_targets",
    "id_pattern",
    "method_templates",
    "min_room",
    "parse",
    "regex_for",
    "schema_for",
]
