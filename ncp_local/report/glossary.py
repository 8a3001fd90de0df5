"""What every report column means, in one place.

The HTML report shows these texts as the columns' tooltips, and the documentation's column tables
are generated from them (scripts/gen_reference.py; `tests/test_glossary.py` holds the generated
tables to them). A new column is defined by adding its row here.
"""

from __future__ import annotations

# (column as headed in the tables, its definition). Order: as the tables show them.
GLOSSARY: tuple[tuple[str, str], ...] = (
    (
        "engine",
        "what answered each role, as the run's manifest records it: `scripted` (no model: the figures measure "
        "the rig), or the engine and model (`vllm: <name> (<path or embedded>)`, `openai: <served name> (served)`)",
    ),
    ("episodes", "finished episodes of the run, `invalid` ones included"),
    (
        "avg turns",
        "mean player turns an episode played, the turn that ended it in a conflict included "
        "(turn N is the N-th player turn; the opening is not a turn)",
    ),
    (
        "turns kept",
        "the restricted mean: the area under S(t) from 0 to the horizon (`report.horizon`, default the turn "
        "cap), i.e. the mean of min(turns, horizon) with censored episodes' unseen turns counted by the curve; "
        "equals avg turns when nothing is censored and the horizon is the cap",
    ),
    (
        "turns",
        "player turns one episode played, the conflicting one included; `n+`: stopped by the context window "
        "(`context_limit`) with n turns committed, so more than n",
    ),
    ("traj %", "mean share of the spec's story beats (trajectory nodes) the episode completed"),
    ("sat %", "mean share of the spec's commitments satisfied at the episode's end"),
    ("fact %", "share of episodes ended by a fact conflict: the narration contradicted an active fact or itself"),
    ("commit %", "share of episodes ended by a commitment conflict: the narration broke a narrative commitment"),
    ("player %", "share of episodes ended by a player-input conflict: the narration contradicted what the player did"),
    ("conflict-free plays", "scored plays no conflict ended: a count (`conflict-free %` in a comparison: their share)"),
    ("conflict", "episodes ended by a conflict the double-check confirmed"),
    ("max_turns", "episodes that played every turn allowed (`max_turns`) without a conflict"),
    ("all_resolved", "episodes that ended early because every achievement commitment was satisfied"),
    (
        "context_limit",
        "episodes stopped because a call no longer fit the model's window: their length is "
        "only known from below (censored)",
    ),
    ("invalid", "episodes a model's answers left unusable after every retry; counted, never averaged"),
    (
        "censored",
        "stopped before the story ended, so its length is only known from below: by the turn cap (`max_turns`, "
        "censored after the last turn) or by a full context window (`context_limit`, censored inside the run's "
        "turns); S(t) and the endings count both as censored. Columns that count only the second are headed "
        "`context_limit`. A report of a run in flight adds a third reason: `in_flight`",
    ),
    (
        "in_flight",
        "episodes with a checkpoint and no result when the report read the run (still playing, or stopped "
        "mid-story): censored at their last committed turn in S(t), turns kept and the endings; the results "
        "table's episodes and averages leave them out (their outcome is not known yet)",
    ),
    ("bound hits", "answers that reached a configured output bound (length or count); none on real models"),
    ("overturned", "conflicts the first check raised and the double-check cleared"),
    ("S(t)", "share of episodes that played t turns or more (Kaplan-Meier when some are censored)"),
    (
        "[lo, hi]",
        "the `report.level` bootstrap interval: stories resampled, each with all its plays (so over episodes "
        "when each story was played once); not shown for fewer than 2 scored episodes",
    ),
    (
        "genre rows",
        "an episode counts once under each genre of its spec (two each in NCP-Bench), so a "
        "run's genre rows add up to more episodes than it has",
    ),
)
# The cost table's columns (report/cost.py), in the order the table shows them.
COST_GLOSSARY: tuple[tuple[str, str], ...] = (
    ("calls", "questions the stage asked a model; a question retried after an invalid answer counts once"),
    ("attempts", "requests sent to the engine, retries included (one line of calls.jsonl each)"),
    ("prompt tok", "prompt tokens of every attempt, the cached ones included"),
    ("cached tok", "prompt tokens the engine's prefix cache served instead of computing them"),
    ("generated tok", "tokens the model generated, over every attempt"),
    ("cache hit %", "cached tokens as a share of prompt tokens"),
    (
        "engine s",
        "seconds the attempts spent in the engine, summed; calls batched together each count their "
        "own time, so under batching this exceeds the time the engine was busy",
    ),
    (
        "busy s",
        "the engine's busy wall-clock seconds charged to this stage: each moment a model's engine "
        "worked is shared equally among the calls in flight then",
    ),
    ("cost", "busy hours x the GPUs of the model's engine (tensor_parallel_size) x report.gpu_hour_cost"),
    (
        "plan prompt tok",
        "the same calls' prompt tokens as mode=plan projects them (its prompt growth played "
        "on the run's recorded config; report.plan=true)",
    ),
)
# The endings table's columns (report/endings.py): each ending's share of the stories by the last turn.
ENDINGS_GLOSSARY: tuple[tuple[str, str], ...] = (
    ("run", "the run's label"),
    ("scored", "episodes the curves rest on: every finished one but the `invalid` ones"),
    (
        "fact %",
        "share of stories a fact conflict alone ended within the run's turns, the last included "
        "(Aalen-Johansen: F_fact(max_turns + 1))",
    ),
    ("commitment %", "the same for a commitment conflict alone"),
    ("player_input %", "the same for a player-input conflict alone"),
    ("several_types %", "the same for one turn's confirmed conflicts of two or three types"),
    ("all_resolved %", "the same for every achievement commitment satisfied"),
    (
        "still going %",
        "share no ending reached within the run's turns (the turn limit stopped them; censored "
        "stories counted by Kaplan-Meier); the endings and this add up to 100",
    ),
    ("max_turns (censored)", "episodes the turn limit stopped: administrative censoring, not an ending"),
    ("context_limit (censored)", "episodes stopped by a full context window: censored, as in S(t)"),
    ("turns band", "episodes by what ended them and how many turns they played (`0`: in the opening)"),
)
# The trials section's columns and rows (report/trials.py): pass^k, the noise floor, each story's plays.
TRIALS_GLOSSARY: tuple[tuple[str, str], ...] = (
    ("t=N", "after N player turns (the pass^k table shows turn 1, the quarters of max_turns and max_turns)"),
    ("S(t) %", "share of the plays still going after t turns (Kaplan-Meier), as on the survival plot"),
    (
        "pass^k %",
        "chance that k plays of a story all survive t turns: the share of a story's k-subsets of plays all "
        "seen surviving among those whose fates at t are known, each weighted by 1/G for censoring, over the "
        "stories (pass^1 = S(t) with as many plays per story); [interval]: Jeffreys' at the effective "
        "sample size of a bootstrap over stories; not estimable where under 10 stories have k plays observed "
        "at t, or censoring leaves under 10 stories' k plays followed through t",
    ),
    ("metric", "a main-table metric, per play (conflict-free %: 100 for a play no conflict ended)"),
    ("mean", "its mean over the scored plays"),
    (
        "within-story var",
        "variance of one play around its story's mean, pooled over the stories: sampling noise (in the "
        "metric's unit squared: squared turns, squared percentage points)",
    ),
    (
        "between-story var",
        "variance of the stories' means less the noise in them (within / plays per story): how the stories "
        "differ (squared units, as within)",
    ),
    (
        "within / between",
        "their ratio (inf: the between-story variance is 0, the stories do not differ beyond the noise)",
    ),
    (
        "smallest real diff, replay",
        "the least difference between two runs of the same stories, as many plays each, that the noise allows "
        "to call real at the report's level: z * sqrt(2 * within / (stories * plays))",
    ),
    (
        "smallest real diff, other stories",
        "the same for two runs of as many other stories: z * sqrt(2 * (between / stories + within / "
        "(stories * plays)))",
    ),
    (
        "found 80% of the time, replay",
        "the difference between two replays of the same stories that a test at the report's level finds 80% of "
        "the time (the smallest real one is found half the time): (z + 0.84) * sqrt(2 * within / (stories * plays))",
    ),
    (
        "found 80% of the time, other stories",
        "the same for two runs of as many other stories: (z + 0.84) * sqrt(2 * (between / stories + within / "
        "(stories * plays)))",
    ),
    ("plays", "the story's scored plays (`invalid` ones left out)"),
    ("survived", "its plays that no conflict ended"),
    ("turns min", "the fewest turns one of its plays played"),
    ("turns median", "the median of its plays' turns"),
    ("turns max", "the most turns one of its plays played"),
    ("turns sd", "the standard deviation of its plays' turns"),
    ("endings", "each play's trial, ending and turns played, e.g. `t1:fact@7`"),
)
_BY_NAME = dict(GLOSSARY)
_COST_BY_NAME = dict(COST_GLOSSARY)
_ENDINGS_BY_NAME = dict(ENDINGS_GLOSSARY)
_TRIALS_BY_NAME = dict(TRIALS_GLOSSARY)


def define(column: str) -> str:
    """The definition of a results column (KeyError for a column nobody defined: add it above)."""
    return _BY_NAME[column]


def define_cost(column: str) -> str:
    """The definition of a cost table column (its header, as report/cost.py shows it)."""
    return _COST_BY_NAME[column]


def define_ending(column: str) -> str:
    """The definition of an endings-table column; a turn band's header (`1-5`, `all`) gets the bands' text."""
    return _ENDINGS_BY_NAME.get(column, _ENDINGS_BY_NAME["turns band"])


def define_trials(column: str) -> str:
    """The definition of a trials-section column or row (`pass^3 %` reads as `pass^k %`, `t=7` as `t=N`)."""
    if column in _TRIALS_BY_NAME:
        return _TRIALS_BY_NAME[column]
    return _TRIALS_BY_NAME["pass^k %" if column.startswith("pass^") else "t=N" if column.startswith("t=") else column]


def plain(text: str) -> str:
    """A definition without its Markdown backticks (HTML tooltips show plain text)."""
    return text.replace("`", "")
