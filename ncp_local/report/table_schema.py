"""The analysis tables' schemas, defined once: `episodes`, `turns`, `calls`, `ledger_events`, `conflicts`,
`runs` (one row per run: the report's main table), and `plants` (one row per figure of an auditor measured
on planted contradictions: mode=plant's table).

Each table is a `TableSchema`: a name, a version, a sentence on what one row is, and its columns, each
with its Arrow type and what it means. The Parquet export (`parquet.py`) writes exactly these columns
with these types and stamps the version into each file's metadata; `ncp_local.analysis` reads them back;
the docs' field-by-field reference is generated from here (scripts/gen_reference.py, `tables`).

A version is bumped when a column changes meaning or type or goes away; a new column at the end keeps
the version (readers select by name). Every episode-level table starts with the same keys (`KEYS`):
which run, its label, its sweep point, and the episode, named by story and trial so that several plays
of one story stay apart (results without a trial are trial 0); the `runs` table with the first three.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# Written into every file's schema metadata (bytes keys, as Parquet keeps them).
META_TABLE = b"ncp_local.table"
META_VERSION = b"ncp_local.schema_version"


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


@dataclass(frozen=True)
class TableSchema:
    name: str
    version: int
    row: str  # what one row is
    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def arrow(self) -> pa.Schema:
        """The Arrow schema, with the table's name and version in its metadata."""
        return pa.schema(
            [pa.field(c.name, c.type, metadata={b"doc": c.doc.encode()}) for c in self.columns],
            metadata={META_TABLE: self.name.encode(), META_VERSION: str(self.version).encode()},
        )


STR, INT, FLOAT, BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()
STRS = pa.list_(pa.string())

KEYS: tuple[Column, ...] = (
    Column("run", STR, "the run directory's name (its key)"),
    Column("label", STR, "the run's row label in the report (what differs between the exported runs)"),
    Column(
        "point",
        STR,
        "the sweep point: the overrides that tell it from the sweep's others (`narrator.temperature=0.2 seed=1`); "
        "null for a run not given through its sweep folder",
    ),
    Column(
        "episode",
        STR,
        "the episode's name, as its result file and report page are named: the story's spec id, with "
        "`~t<trial>` after it for trials above 0 (`movie48~t2`)",
    ),
    Column("spec_id", STR, "the story (spec) the episode played"),
    Column("trial", INT, "the play of that story (0 when the run plays each story once)"),
)
TURN_KEYS: tuple[Column, ...] = (
    Column("turn", INT, "the record's turn id: -1 the opening, 0 the first player turn (the reference's numbering)"),
    Column("turn_number", INT, "the turn as people count it: turn 1 is the first player turn, 0 the opening"),
)
TOKENS: tuple[Column, ...] = (
    Column("calls", INT, "calls made (first attempts) in the call log"),
    Column("attempts", INT, "attempts, retries included (lines of the call log)"),
    Column("prompt_tokens", INT, "prompt tokens over those attempts"),
    Column("cached_tokens", INT, "prompt tokens served from the prefix cache"),
    Column("generated_tokens", INT, "tokens generated"),
    Column("engine_s", FLOAT, "seconds in the engine, summed over attempts (calls overlap under batching)"),
)

EPISODES = TableSchema(
    "episodes",
    2,  # 2: `censored` counts max_turns too (the glossary's one sense), not context_limit alone
    "one finished episode (one result file): what the report's tables are computed from",
    (
        *KEYS,
        Column("title", STR, "the story's title (null when the spec was not found)"),
        Column("genres", STRS, "the story's genres (empty when the spec was not found)"),
        Column("initial_facts", INT, "facts the spec starts with, inactive ones included"),
        Column("commitments", INT, "the spec's commitments (all three types)"),
        Column("achievements", INT, "of which achievement commitments"),
        Column("nodes", INT, "trajectory nodes"),
        Column("termination", STR, "conflict, max_turns, all_resolved, context_limit or invalid"),
        Column("reason", STR, "why an invalid or context_limit episode ended (empty otherwise)"),
        Column("ending", STR, "what ended the story: a conflict's type, several_types, or the termination"),
        Column(
            "censored",
            BOOL,
            "true for max_turns and context_limit: stopped before the story ended, its length only known from below",
        ),
        Column("scored", BOOL, "counted in the averages (every termination but invalid)"),
        Column("turns", INT, "turn records, the conflicting one included (the report's `avg turns` averages it)"),
        Column("max_turns", INT, "the turn limit the episode ran under"),
        Column("trajectory_progress", FLOAT, "completed nodes / all nodes at the end (0-1; `traj %` is 100x)"),
        Column("satisfied", FLOAT, "satisfied commitments / all commitments at the end (0-1; `sat %` is 100x)"),
        Column("nodes_completed", INT, "trajectory nodes completed at the end"),
        Column("commitments_satisfied", INT, "commitments satisfied at the end"),
        Column("facts_final", INT, "facts in the final ledger, inactive ones included"),
        Column("facts_active_final", INT, "active facts in the final ledger"),
        Column("fact", BOOL, "the ending conflict included a fact conflict"),
        Column("commitment", BOOL, "the ending conflict included a commitment conflict"),
        Column("player_input", BOOL, "the ending conflict included a player-input conflict"),
        Column("bound_hits", INT, "outputs that reached a configured bound (opening included)"),
        Column("thought_tokens", INT, "tokens the accepted answers spent thinking (thinking models)"),
        *TOKENS,
    ),
)

TURNS = TableSchema(
    "turns",
    1,
    "one turn record of a finished episode (the conflicting turn included; the opening is not a turn)",
    (
        *KEYS,
        *TURN_KEYS,
        Column("committed", BOOL, "the turn committed (false: a standing conflict ended the episode here)"),
        Column("conflict", BOOL, "a conflict stood after the double-check"),
        Column("conflict_types", STRS, "the standing conflicts' types, in the record's order"),
        Column("first_check_conflicts", INT, "conflicts the first conflict check raised"),
        Column("double_checked", BOOL, "the double-check ran (the first check raised a conflict)"),
        Column("confirmed", BOOL, "the double-check's verdict (null: no double-check)"),
        Column("node", STR, "the trajectory node under check this turn (the first pending one; null: none left)"),
        Column("node_completed", STR, "the node this turn completed (null: none)"),
        Column("nodes_completed", INT, "nodes completed by the end of the turn (before it, when it did not commit)"),
        Column(
            "commitments_satisfied", INT, "commitments satisfied at the end of the turn (before it, if not committed)"
        ),
        Column("newly_satisfied", STRS, "commitments this turn's status check moved to satisfied"),
        Column("back_to_pending", STRS, "commitments this turn's status check moved back to pending"),
        Column(
            "facts_added",
            INT,
            "facts the turn's update added (candidates on a turn that did not commit; null: no spec)",
        ),
        Column("facts_negated", INT, "facts the turn's update negated (likewise)"),
        Column("facts_active", INT, "active facts at the end of the turn (before it, if not committed; null: no spec)"),
        Column("facts_total", INT, "ledger size at the end of the turn, inactive facts included (likewise)"),
        Column("player_input", STR, "the player's input"),
        Column("response", STR, "the narrator's response"),
        Column("bound_hits", STRS, "outputs of this turn that reached a bound, as stage:bound"),
        Column("thought_tokens", INT, "tokens this turn's accepted answers spent thinking"),
        *TOKENS,
    ),
)

CALLS = TableSchema(
    "calls",
    1,
    "one line of a call log (`calls.jsonl`, the run's and each shard's): one attempt of one call",
    (
        *KEYS,
        Column("part", STR, "where the line was logged: empty for the run directory, else its shard's directory"),
        Column("line", INT, "the line's position in that call log (0-based, among the lines that parse)"),
        *TURN_KEYS,
        Column("stage", STR, "the protocol stage (opening, player, narrate, fact_update, conflict_check, ...)"),
        Column("role", STR, "narrator, player or auditor"),
        Column("model", STR, "the model that served the call (`scripted` when none did)"),
        Column("attempt", INT, "0 for the first attempt, 1 and 2 for retries"),
        Column("key", STR, "tells two calls of one stage in one turn apart (empty for most)"),
        Column("seed", INT, "the call's seed"),
        Column("prompt_tokens", INT, "prompt tokens"),
        Column("cached_tokens", INT, "prompt tokens served from the prefix cache"),
        Column("generated_tokens", INT, "tokens generated"),
        Column("max_tokens_sent", INT, "the output budget sent when the window left less than the stage's"),
        Column("latency_s", FLOAT, "seconds in the engine"),
        Column("done_at", FLOAT, "when the attempt ended (Unix seconds)"),
        Column("overhead_s", FLOAT, "the rig's own seconds for the call (render, schema, parse, log)"),
        Column("finish_reason", STR, "the engine's finish reason (stop, length, error, context_overflow)"),
        Column("accepted", BOOL, "the answer was accepted (no error)"),
        Column("error", STR, "why the attempt failed (null when accepted)"),
        Column("output", STR, "a failed attempt's raw text (null when accepted: the result keeps the answer)"),
        Column("speculative", BOOL, "a next turn's player asked early for a turn that never happened"),
        Column("grammar_new", BOOL, "the engine compiled this grammar for this call (null: not reported)"),
        Column("bound_hits", STRS, "bounds the answer reached"),
        Column("transport_errors", INT, "an endpoint's connection errors and retried statuses before the answer"),
        Column("thought_tokens", INT, "a thinking model's thought tokens (null: not a thinking model)"),
    ),
)

EVENT_KINDS: tuple[str, ...] = (
    "fact_added",
    "fact_negated",
    "node_reached",
    "commitment_satisfied",
    "commitment_pending",
)
LEDGER_EVENTS = TableSchema(
    "ledger_events",
    1,
    "one committed change of an episode's state: a fact added or negated, a node reached, a commitment's "
    "status changed (a turn that ended in a conflict committed nothing and has none)",
    (
        *KEYS,
        *TURN_KEYS,
        Column("seq", INT, "the event's position in its episode (0-based, in the order the turn committed them)"),
        Column("event", STR, "one of " + ", ".join(EVENT_KINDS)),
        Column("source", STR, "`opening` for the opening's updates (committed with turn 0), else `turn`"),
        Column("target", STR, "the fact, node or commitment id"),
        Column("text", STR, "the fact's text, the node's description, or the commitment's description"),
        Column("commitment_type", STR, "invariant, ordering or achievement (commitment events only)"),
    ),
)

CONFLICTS = TableSchema(
    "conflicts",
    1,
    "one conflict an audit raised: by the first check, or by the double-check alone",
    (
        *KEYS,
        *TURN_KEYS,
        Column("type", STR, "fact, commitment or player_input"),
        Column("id", STR, "the id cited: a fact or commitment id, `input`, or `response_internal`"),
        Column("internal", BOOL, "a fact conflict inside the narration itself (`response_internal`)"),
        Column("target_text", STR, "the cited fact's text, commitment's description or the player input"),
        Column("raised_by", STR, "`first_check`, or `double_check` for one only the review named"),
        Column("reason", STR, "the first check's reason (null when only the review named it)"),
        Column("double_checked", BOOL, "the double-check ran on this turn"),
        Column("confirmed", BOOL, "the double-check's verdict on the turn (null: none ran)"),
        Column("review_reason", STR, "the double-check's reason for its verdict"),
        Column("reason_reviewed", STR, "the reviewed conflict's reason (null when the review dropped it)"),
        Column("standing", BOOL, "the conflict stood after the double-check"),
        Column("ended_episode", BOOL, "it stood and the episode ended in a conflict at this turn"),
        Column("failure_mode", STR, "the failure mode a classifier gave it (null: none recorded)"),
    ),
)


def _figure(key: str, what: str) -> tuple[Column, ...]:
    """A figure of the main table with its interval's ends (null with fewer than 2 scored episodes)."""
    return (
        Column(key, FLOAT, what),
        Column(f"{key}_lo", FLOAT, f"the low end of `{key}`'s interval (null: no interval)"),
        Column(f"{key}_hi", FLOAT, f"the high end of `{key}`'s interval (null: no interval)"),
    )


RUNS = TableSchema(
    "runs",
    1,
    "one run: the figures of the report's main table (`results.csv`), each with its bootstrap interval",
    (
        *KEYS[:3],
        Column("run_dir", STR, "the run directory's path"),
        Column("engine", STR, "the engine that served the run (its manifest's)"),
        Column("narrator_model", STR, "the narrator's model"),
        Column("player_model", STR, "the player's model"),
        Column("auditor_model", STR, "the auditor's model"),
        Column("episodes", INT, "finished episodes, invalid ones included"),
        Column("scored", INT, "episodes the averages are over (every termination but invalid)"),
        Column("censored", INT, "scored episodes stopped before their story ended (max_turns and context_limit)"),
        Column("unfinished", INT, "episodes with a checkpoint but no result (left out)"),
        Column("turn_cap", INT, "the run's turn limit (max_turns)"),
        Column("horizon", INT, "turns the restricted mean (`turns_kept`) runs to: `report.horizon`, else the cap"),
        *_figure("avg_turns", "mean turns of the scored episodes, censored ones at their committed turns"),
        *_figure(
            "turns_kept",
            "the restricted mean: the area under the Kaplan-Meier S(t) to `horizon`, the figure to quote "
            "when episodes are censored (equals avg_turns when none is and the horizon is the cap)",
        ),
        *_figure("trajectory_pct", "mean trajectory progress, percent"),
        *_figure("satisfied_pct", "mean share of commitments satisfied, percent"),
        *_figure("fact_pct", "share of scored episodes ending in a fact conflict, percent"),
        *_figure("commitment_pct", "share ending in a commitment conflict, percent"),
        *_figure("player_input_pct", "share ending in a player-input conflict, percent"),
        Column("conflict_free", INT, "scored episodes that did not end in a conflict"),
        Column("conflict_free_lo", FLOAT, "the low end of its interval (a count; null: no interval)"),
        Column("conflict_free_hi", FLOAT, "the high end of its interval (null: no interval)"),
        Column("conflict", INT, "episodes ended by a standing conflict"),
        Column("max_turns", INT, "episodes stopped by the turn cap"),
        Column("all_resolved", INT, "episodes ended with every achievement resolved"),
        Column("context_limit", INT, "episodes stopped because a call no longer fit the window"),
        Column("invalid", INT, "invalid episodes (kept out of every average)"),
        Column("bound_hits", INT, "outputs that reached a configured bound"),
        Column("level", FLOAT, "the intervals' confidence level"),
        Column("resamples", INT, "bootstrap draws behind the intervals"),
        Column("seed", INT, "the bootstrap's seed"),
    ),
)

PLANTS = TableSchema(
    "plants",
    1,
    "one figure of one auditor measured against planted contradictions (a plant directory, mode=plant): "
    "plants.csv's row, with its interval clustered by story",
    (
        Column("run", STR, "the plant directory's name"),
        Column("label", STR, "the judged auditor, as the figures name it (a scripted one by the rates it was given)"),
        KEYS[2],
        Column("plant_dir", STR, "the plant directory's path"),
        Column("source", STR, "the planted run's identity (its path when it has none)"),
        Column("plants", STR, "the items' digest: auditors with the same digest judged the same items (paired)"),
        Column(
            "figure",
            STR,
            "recall:<type>, type_right:<type>, id_right:<type>, false_alarm (any type) or false_alarm:<type>",
        ),
        Column(
            "measure",
            STR,
            "recall (a conflict stands on a planted item), type_right (of the planted type), id_right (of that "
            "type, citing the planted fact, commitment or `input`), or false_alarm (a conflict on a clean item)",
        ),
        Column("conflict_type", STR, "fact, commitment or player_input (null: a false alarm of any type)"),
        Column("hits", INT, "items that count as hits"),
        Column("items", INT, "items the figure counts: the planted items of its type, or the clean items"),
        Column("stories", INT, "stories those items come from (the intervals draw stories)"),
        *_figure("value", "hits / items (0-1; null: no item)"),
        Column("level", FLOAT, "the intervals' confidence level"),
        Column("resamples", INT, "bootstrap draws behind the intervals"),
        Column("seed", INT, "the bootstrap's seed"),
    ),
)

TABLES: dict[str, TableSchema] = {t.name: t for t in (EPISODES, TURNS, CALLS, LEDGER_EVENTS, CONFLICTS, RUNS, PLANTS)}
