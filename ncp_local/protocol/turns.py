"""Turn numbers: records keep the reference's turn ids, people read the paper's count.

A record's `turn` (results, checkpoints, `calls.jsonl`, re-audits) is the reference's turn id: the
opening is -1 and the first player turn 0, because the reference's own results use it. Everything a
person reads (HTML, plan, review sheet, messages, survival plot and CSV) counts as the paper does:
"turn N" is the N-th player turn, so turn id N-1, and the opening comes before turn 1. An episode
that ended at turn N has N turn records, and S(t), the share of episodes that played t turns or
more, counts it through t = N. Every reader converts here, nowhere else (docs/reference/run-directory.md).
"""

from __future__ import annotations

OPENING = -1  # the opening's turn id in records


def shown(turn_id: int) -> int:
    """The paper's number of a record's turn id: the N-th player turn (0 for the opening)."""
    return turn_id + 1


def id_of(number: int) -> int:
    """The record's turn id of the paper's turn `number` (0: the opening)."""
    return number - 1


def played(turn_id: int) -> int:
    """How many turns an episode played when it ended at this turn id (it has that many turn records)."""
    return shown(turn_id)


def resumed(played_turns: int, k: int = 1) -> int:
    """The turn id of the k-th turn an episode plays when resumed after `played_turns` turns."""
    return id_of(played_turns + k)


def label(turn_id: int) -> str:
    """How a person reads a record's turn id: "opening", "turn 1", "turn 2", ..."""
    return "opening" if turn_id <= OPENING else f"turn {shown(turn_id)}"


def at(turn_id: int) -> str:
    """The same in a sentence: "at the opening", "at turn 3"."""
    return "at the opening" if turn_id <= OPENING else f"at turn {shown(turn_id)}"
