"""An unfinished episode's record: `checkpoints/<episode>.jsonl`, one line per committed turn.

Format 2 of a checkpoint (format 1 rewrote the whole episode, `checkpoints/<episode>.json`, at every
turn, so a turn's cost grew with the episode: 15.6 ms of sealing at turn 100 against 1.0 at turn 1).
Now a turn appends what it adds and nothing else:

    line 1       the base: the seal (spec id, trial, spec hash, run identity) and a whole `Checkpoint`,
                 the episode just after its opening (or as a format-1 checkpoint left it)
    line 2, ...  one committed turn each: its `TurnRecord`, the plot nodes and commitment statuses after
                 it, the number of ledger facts after it, the narrator's state when it changed

The state after a line is the state before it advanced by `ledger.commit_turn` on the turn's own record,
the transition the episode itself made; the fact count and the statuses on the line check that replay.

Every line is framed `{"sha256":"<64 hex>","prev":"<64 hex>","body":<JSON>}` where `sha256` hashes
`prev` + the body's bytes and `prev` is the line before's `sha256` (zeros on line 1). The chain finds a
torn line (a crash mid-write), an edited one and one from another episode's log; a reader keeps the lines
before the first bad one and the store moves that line and the rest to `quarantine/`. Each line is
serialized once, by pydantic's compiled serializer, and hashed once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..protocol import ledger
from ..protocol.episode import to_update
from ..protocol.ledger import EpisodeState, Exchange, Status
from ..protocol.records import Checkpoint, TurnRecord
from ..protocol.trials import parse_episode
from .formats import FORMAT_KEY, VERSIONS, check_version
from .identity import Identity
from .seals import check_result

SUFFIX = ".jsonl"
GENESIS = "0" * 64
# Line 1 as the unchecked readers (status, progress) take it: a whole format-1 episode carried over is a
# few MB; a file of one endless line is not read whole.
_LINE1_MAX = 64 << 20
_FRAME = re.compile(rb'^\{"sha256":"([0-9a-f]{64})","prev":"([0-9a-f]{64})","body":(.*)\}\n$', re.DOTALL)


class LogSeal(BaseModel):
    """Whose log this is: the same facts a format-1 checkpoint's seal carried, less the record hash
    (each line carries its own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    spec_id: str
    trial: int = 0
    spec_sha256: str
    run: str


class TurnEntry(BaseModel):
    """One committed turn, as a line of the log."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    turn: TurnRecord
    node_occurred: tuple[bool, ...]
    statuses: tuple[tuple[str, Status], ...]
    facts: int  # ledger entries after the turn: checks the replayed state
    narrator_state: dict[str, Any] | None = None  # when it changed (None: as on the line before)


def _frame(prev: str, body: bytes) -> tuple[bytes, str]:
    digest = hashlib.sha256(prev.encode("ascii") + body).hexdigest()
    head = b'{"sha256":"' + digest.encode("ascii") + b'","prev":"' + prev.encode("ascii") + b'","body":'
    return head + body + b"}\n", digest


def base_line(cp: Checkpoint, spec_sha256: str, run: str) -> tuple[bytes, str]:
    """Line 1 of a log: the seal and the whole checkpoint (once per episode, or once per format-1
    checkpoint carried over); (line, its hash)."""
    seal = LogSeal(spec_id=cp.spec_id, trial=cp.trial, spec_sha256=spec_sha256, run=run)
    body = (
        b'{"' + FORMAT_KEY.encode() + b'":' + str(VERSIONS["checkpoint"]).encode()
        + b',"seal":' + seal.model_dump_json(exclude_defaults=True).encode()
        + b',"checkpoint":' + cp.model_dump_json().encode() + b"}"
    )  # fmt: skip
    return _frame(GENESIS, body)


def turn_line(prev: str, cp: Checkpoint, narrator_changed: bool) -> tuple[bytes, str]:
    """The line of `cp`'s last turn, chained to `prev`; (line, its hash). Its cost is the turn's, not
    the episode's: nothing earlier is serialized again."""
    entry = TurnEntry(
        turn=cp.turns[-1],
        node_occurred=cp.state.node_occurred,
        statuses=cp.state.statuses,
        facts=len(cp.state.facts),
        narrator_state=cp.narrator_state if narrator_changed else None,
    )
    return _frame(prev, entry.model_dump_json().encode())


@dataclass
class LogRead:
    """What a log holds up to its first bad line."""

    checkpoint: Checkpoint | None  # None: line 1 itself is bad (or the file is empty)
    last: str = GENESIS  # the hash the next line chains to
    good_bytes: int = 0  # the length of the good lines: the file is cut here when a line is bad
    lines: int = 0  # good lines
    problem: str = ""  # why line `lines + 1` is bad ("" when every line is good)
    tail: bytes = field(default=b"", repr=False)  # the bad line and the rest


def read_log(
    path: Path, run: str | None, spec_hashes: Mapping[str, str] | None = None, raw: bytes | None = None
) -> LogRead:
    """Read `path` (or its bytes, `raw`) line by line, stopping at the first line that fails; a log of
    a newer format raises `NewerFormat` (refused, never taken for damage)."""
    if raw is None:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            return LogRead(None, problem=f"cannot read ({exc.strerror})", tail=b"")
    name = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.stem
    out = LogRead(None)
    offset = 0
    state: EpisodeState | None = None
    turns: list[TurnRecord] = []
    narrator: dict[str, Any] = {}
    base: Checkpoint | None = None
    while offset < len(raw):
        end = raw.find(b"\n", offset)
        line = raw[offset:] if end < 0 else raw[offset : end + 1]
        m, problem = _link(line, out.last)
        if m is not None and not problem:
            body = m.group(3)
            if base is None:
                base, problem = _base(path, body, name, run, spec_hashes)
                if base is not None:
                    state, turns, narrator = base.state, list(base.turns), dict(base.narrator_state)
            else:
                assert state is not None
                state, entry, problem = _advance(state, body, len(turns))
                if entry is not None:
                    turns.append(entry.turn)
                    if entry.narrator_state is not None:
                        narrator = entry.narrator_state
        if problem:
            out.problem, out.tail = f"line {out.lines + 1}: {problem}", raw[offset:]
            break
        assert m is not None
        out.last, out.lines, offset = m.group(1).decode(), out.lines + 1, offset + len(line)
        out.good_bytes = offset
    if base is not None and state is not None:
        out.checkpoint = base.model_copy(update={"state": state, "turns": tuple(turns), "narrator_state": narrator})
    elif not out.problem:
        out.problem = "empty (no line 1)"
    return out


def logged_turns(path: Path, last: str, turns: int) -> list[bytes] | None:
    """The writer's read-back of its own log at an episode's end: each turn's `model_dump_json()` as its
    line holds it, turn 0 first, when the lines chain, each matching its hash, from line 1 to `last` (the
    hash the writer computed for the last line it wrote) and hold turns 0 to `turns` - 1, one a line; else
    None (a line edited or damaged, a carried-over format-1 checkpoint's turns on line 1): `read_log` then.

    Ending at `last`, the lines are the bytes this run wrote from the episode's own records (a resumed
    episode's earlier lines were read by `read_log` when it resumed), so no line's state is validated nor
    replayed: what made reading back 7 of the 19 ms of CPU that building a 100-turn result took."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    lines = raw.splitlines(keepends=True)
    if len(lines) != turns + 1:
        return None
    prev, out = GENESIS, []
    for k, line in enumerate(lines):
        m, problem = _link(line, prev)
        if m is None or problem:
            return None
        prev = m.group(1).decode()
        if k:
            # TurnEntry's JSON: its `turn` first, then `node_occurred`, a key no turn record holds.
            body, start = m.group(3), b'{"turn":{"turn":%d,' % (k - 1)
            end = body.find(b',"node_occurred":[')
            if not body.startswith(start) or end < 0:
                return None
            out.append(body[len(b'{"turn":') : end])
    return out if prev == last else None


def _link(line: bytes, prev: str) -> tuple[re.Match[bytes] | None, str]:
    """A line's frame, and why it is not the whole line that follows the one hashed `prev` ("" if it is)."""
    m = _FRAME.match(line)
    if m is None:
        return None, "not a line of a turn log (damaged)" if line.endswith(b"\n") else "cut short (a crash mid-write)"
    if m.group(2).decode() != prev:
        return m, "does not follow the line before (a line from another log, or lines reordered)"
    if hashlib.sha256(m.group(2) + m.group(3)).hexdigest() != m.group(1).decode():
        return m, "its content does not match its hash (edited or damaged)"
    return m, ""


def _base(
    path: Path, body: bytes, name: str, run: str | None, spec_hashes: Mapping[str, str] | None
) -> tuple[Checkpoint | None, str]:
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            return None, "line 1 is not a JSON object"
        check_version(path, data, "checkpoint")
        seal = LogSeal.model_validate(data.get("seal"))
        cp = Checkpoint.model_validate(data.get("checkpoint"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, "not JSON (damaged)"
    except ValidationError as exc:
        err = exc.errors()[0]
        return None, f"not a turn log's line 1: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    try:
        expected = parse_episode(name)
    except ValueError:
        return None, "not an episode's file (a stray file)"
    if (seal.spec_id, seal.trial) != expected or (cp.spec_id, cp.trial) != expected:
        return None, f"holds episode {seal.spec_id!r} (trial {seal.trial}), not {name!r} (a file moved or copied)"
    if run is not None and seal.run != run:
        return None, f"from another run (identity {seal.run}, this run is {run})"
    if spec_hashes is not None:
        if seal.spec_id not in spec_hashes:
            return None, f"no spec {seal.spec_id!r} in the run's dataset (a stray file)"
        if seal.spec_sha256 and seal.spec_sha256 != spec_hashes[seal.spec_id]:
            return None, f"played on another version of spec {seal.spec_id!r}"
    return cp, ""


def _advance(state: EpisodeState, body: bytes, done: int) -> tuple[EpisodeState, TurnEntry | None, str]:
    """The state after one logged turn, by the episode's own transition on the turn's record; (state,
    the line's entry, "") or (the state before, None, why the line is bad)."""
    try:
        entry = TurnEntry.model_validate_json(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        return state, None, f"not a turn: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    rec = entry.turn
    if rec.turn != done:
        return state, None, f"holds turn {rec.turn}, not turn {done} (lines out of order)"
    after = ledger.commit_turn(
        state,
        to_update(rec.fact_update),
        entry.node_occurred,
        entry.statuses,
        Exchange(player_input=rec.player_input, response=rec.response),
    )
    if len(after.facts) != entry.facts or len(entry.node_occurred) != len(state.node_occurred):
        return state, None, "its turn does not replay to the state it recorded (a spec or rig changed?)"
    return after, entry, ""


def turns_logged(path: Path) -> int:
    """Committed turns a log records, read without its checks (progress and status count with it while
    the run writes): the base's turns plus one per whole line after it; 0 when line 1 is unreadable."""
    try:
        with open(path, "rb") as f:
            first = f.readline(_LINE1_MAX)
            rest = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        m = _FRAME.match(first)
        if m is None:
            return 0
        data = json.loads(m.group(3))
        return len(((data.get("checkpoint") or {}).get("turns")) or ()) + rest
    except (OSError, ValueError, AttributeError, RecursionError):
        return 0


def seal_of(path: Path) -> dict[str, Any] | None:
    """Line 1's seal, unchecked (None when unreadable): which run a log says it belongs to."""
    try:
        with open(path, "rb") as f:
            m = _FRAME.match(f.readline(_LINE1_MAX))
        seal = json.loads(m.group(3)).get("seal") if m else None
        return seal if isinstance(seal, dict) else None
    except (OSError, ValueError, AttributeError, RecursionError):
        return None


def checkpoint_paths(folder: Path) -> dict[str, Path]:
    """Episode -> its checkpoint in a run's `checkpoints/` folder: its turn log, or a format-1
    `<episode>.json` where it has none (a run written before, not yet resumed)."""
    out: dict[str, Path] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        if name.startswith("."):
            continue
        if name.endswith(SUFFIX):
            out[name[: -len(SUFFIX)]] = folder / name
        elif name.endswith(".json"):
            out.setdefault(name[: -len(".json")], folder / name)
    return out


def read_checkpoint(path: Path, manifest: Mapping[str, Any]) -> tuple[Checkpoint | None, str]:
    """A reader's check of one checkpoint (either format) against its run's manifest, nothing moved:
    (checkpoint, "") or (None, why). A log with a bad last line gives what its good lines hold (a log
    read while a turn is appended ends cut short)."""
    if not path.name.endswith(SUFFIX):
        return check_result(path, manifest, Checkpoint)
    parts = manifest.get("identity_parts")
    got = read_log(path, manifest.get("identity"), Identity(parts).spec_hashes() or None if parts else None)
    return got.checkpoint, got.problem if got.checkpoint is None else ""
