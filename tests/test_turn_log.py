"""The turn log (checkpoint format 2): a line per committed turn, chained; what a turn writes is its own
size, whatever the episode's length; damage costs the bad line and those after it; a run of format 1
(`checkpoints/<episode>.json`) still resumes."""

from __future__ import annotations

import errno
import json
import random
import threading
from pathlib import Path

import pytest

from ncp_local import config as config_mod
from ncp_local import modes
from ncp_local.errors import InputError
from ncp_local.protocol import ledger
from ncp_local.protocol.episode import Ending, to_update
from ncp_local.protocol.ledger import EpisodeState, Exchange, FactEntry, FactUpdate
from ncp_local.protocol.records import Checkpoint, EpisodeResult, FactUpdateRecord, TurnRecord
from ncp_local.protocol.replay import replay
from ncp_local.protocol.spec import Spec, load_spec
from ncp_local.rundir import writer as writer_mod
from ncp_local.rundir.atomic import DiskFull
from ncp_local.rundir.formats import FORMAT_KEY
from ncp_local.rundir.seals import SEAL, _body_hash, sealed_json
from ncp_local.rundir.store import RunDir, RunMismatch
from ncp_local.rundir.turn_log import GENESIS, SUFFIX, _frame, logged_turns, read_log, turns_logged

ROOT = Path(__file__).resolve().parent.parent
RUN = "run-key"


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Spec, EpisodeResult]]:
    """Our own stories played 12 turns on scripted answers (no conflict ends them)."""
    out = tmp_path_factory.mktemp("played") / "run"
    cfg = config_mod.compose(
        ["engine=scripted", "max_turns=12", "progress=false", "engine.conflict_rate=0", f"out_dir={out}"]
    )
    assert modes.main(cfg) == 0
    got = []
    for path in sorted((out / "results").glob("*.json")):
        data = json.loads(path.read_text())
        data.pop(SEAL)
        result = EpisodeResult.model_validate(data)
        got.append((load_spec(ROOT / "specs" / "specs" / f"{result.spec_id}.yaml"), result))
    assert got and all(len(r.turns) >= 6 for _, r in got), [len(r.turns) for _, r in got]
    return got


def _commits(spec: Spec, result: EpisodeResult) -> list[Checkpoint]:
    """The checkpoints the episode committed: after its opening, then after each turn."""
    views = replay(spec, result).turns
    opening = replay(spec, result).opening_state
    cps = [
        Checkpoint(spec_id=spec.id, state=opening, opening_update=result.opening_update, turns=(), narrator_state={})
    ]
    for k, view in enumerate(views):
        assert view.after is not None
        cps.append(cps[0].model_copy(update={"state": view.after, "turns": result.turns[: k + 1]}))
    return cps


def _in_log(cp: Checkpoint) -> Checkpoint:
    """`cp` as a resumed episode gets it from its log: its turns left there (the episode hands its turns on
    at their commits, and its result is made from the log)."""
    return cp.model_copy(update={"turns": (), "turns_before": len(cp.turns)})


def _store(root: Path) -> RunDir:
    store = RunDir(root)
    store.open({"test": True}, RUN)
    return store


def _log(root: Path, episode: str) -> Path:
    return root / "checkpoints" / f"{episode}{SUFFIX}"


def _write_all(root: Path, cps: list[Checkpoint]) -> None:
    store = _store(root)
    for cp in cps:
        store.write_checkpoint(cp).result()
    store.close()


def test_the_log_reads_back_every_commit_exactly(tmp_path: Path, played: list[tuple[Spec, EpisodeResult]]) -> None:
    for spec, result in played:
        cps = _commits(spec, result)
        for cut in (1, 2, len(cps)):  # the opening alone, one turn, every turn
            root = tmp_path / f"{spec.id}-{cut}"
            _write_all(root, cps[:cut])
            store = _store(root)
            assert store.quarantined == []
            assert store.load_checkpoint(spec.id) == _in_log(cps[cut - 1])
            store.close()
            assert read_log(_log(root, spec.id), RUN).checkpoint == cps[cut - 1]
            assert turns_logged(_log(root, spec.id)) == cut - 1


def test_a_turn_writes_its_own_size_whatever_the_episode_length(
    tmp_path: Path, played: list[tuple[Spec, EpisodeResult]]
) -> None:
    """Format 1 rewrote every earlier turn at each commit; a line holds one turn and never an earlier
    turn's text, so the bytes a turn writes do not grow with the turn."""
    spec, result = max(played, key=lambda p: len(p[1].turns))
    _write_all(tmp_path, _commits(spec, result))
    lines = _log(tmp_path, spec.id).read_bytes().splitlines()
    assert len(lines) == 1 + len(result.turns)
    for k, line in enumerate(lines[1:]):
        body = json.loads(line)["body"]
        assert body["turn"]["turn"] == k
        earlier = [t.response for t in result.turns[:k] if t.response not in result.turns[k].response]
        assert not any(text in line.decode() for text in earlier), f"turn {k}'s line repeats an earlier turn"
        # Its size is its turn's record and a few small fields, not the episode's.
        assert len(line) < len(result.turns[k].model_dump_json()) + 600


@pytest.mark.parametrize("damage", ["torn", "edited", "foreign", "reordered", "garbage"])
def test_a_bad_line_costs_it_and_those_after_it_named_in_one_line(
    tmp_path: Path, damage: str, played: list[tuple[Spec, EpisodeResult]], capsys: pytest.CaptureFixture[str]
) -> None:
    (spec, result), (other_spec, other) = played[0], played[1]
    cps = _commits(spec, result)
    _write_all(tmp_path / "other", _commits(other_spec, other))
    tmp_path = tmp_path / "run"
    _write_all(tmp_path, cps)
    path = _log(tmp_path, spec.id)
    lines = path.read_bytes().splitlines(keepends=True)
    bad = random.Random(damage).randrange(2, len(lines) - 1)  # a turn's line (1-based: bad + 1)
    if damage == "torn":
        lines, bad = lines[:-1] + [lines[-1][: len(lines[-1]) // 2]], len(lines) - 1
    elif damage == "edited":
        lines[bad] = lines[bad].replace(b'"response":"', b'"response":"X', 1)
    elif damage == "foreign":
        lines[bad] = _log(tmp_path.parent / "other", other_spec.id).read_bytes().splitlines(keepends=True)[bad]
    elif damage == "reordered":
        lines[bad], lines[bad + 1] = lines[bad + 1], lines[bad]
    else:
        lines[bad] = b"\x00\xff not a line\n"
    path.write_bytes(b"".join(lines))
    capsys.readouterr()
    store = _store(tmp_path)
    (line,) = store.quarantined
    assert line.startswith(f"{path}: line {bad + 1}: ") and "\n" not in line
    assert f"resumes after its {bad - 1} committed turn(s)" in line
    # The good lines stay and resume; the bad line and the rest are kept whole in quarantine/.
    assert store.load_checkpoint(spec.id) == _in_log(cps[bad - 1])
    moved = tmp_path / "quarantine" / "checkpoints" / path.name
    assert path.read_bytes() + moved.read_bytes() == b"".join(lines)
    # The next commit chains to the last good line.
    store.write_checkpoint(cps[bad]).result()
    store.close()
    assert read_log(path, RUN).problem == "" and read_log(path, RUN).checkpoint == cps[bad]


def test_a_log_of_another_run_or_a_bad_line_1_is_moved_aside_whole(
    tmp_path: Path, played: list[tuple[Spec, EpisodeResult]]
) -> None:
    spec, result = played[0]
    cps = _commits(spec, result)
    b, tmp_path = tmp_path / "b", tmp_path / "a"
    store = RunDir(tmp_path)
    store.open({"test": True}, "another-run")
    for cp in cps[:3]:
        store.write_checkpoint(cp)
    store.close()
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(RunMismatch, match="sealed by run 'another-run'"):
        _store(tmp_path)  # no manifest, yet a log sealed by another run: refused, nothing moved
    path = _log(tmp_path, spec.id)
    assert turns_logged(path) == 2
    _write_all(b, cps[:3])
    path = _log(b, spec.id)
    path.write_bytes(path.read_bytes().replace(b'"run":"run-key"', b'"run":"run-kez"', 1))
    store = _store(b)
    (line,) = store.quarantined
    assert line.startswith(f"{path}: line 1: its content does not match its hash") and "from the start" in line
    assert store.load_checkpoint(spec.id) is None and not path.exists()
    store.close()


def test_a_format_1_checkpoint_resumes_and_becomes_a_log(
    tmp_path: Path, played: list[tuple[Spec, EpisodeResult]]
) -> None:
    """A run directory written before format 2: its `<episode>.json` (the whole checkpoint, sealed as
    fceb218 sealed it) is read, the next commit starts a log with it, and the old file goes."""
    spec, result = played[0]
    cps = _commits(spec, result)
    root = tmp_path / "run"
    _store(root).close()
    old = root / "checkpoints" / f"{spec.id}.json"
    body = cps[3].model_dump(mode="json")
    seal = {"spec_id": spec.id, "spec_sha256": "", "run": RUN, "sha256": _body_hash(cps[3])}
    old.write_text(json.dumps({SEAL: seal, **body}, indent=1, ensure_ascii=False))
    assert FORMAT_KEY not in old.read_text()
    store = _store(root)
    assert store.load_checkpoint(spec.id) == cps[3]
    store.write_checkpoint(cps[4]).result()
    store.write_checkpoint(cps[5]).result()
    store.close()
    assert not old.exists()
    store = _store(root)
    assert store.load_checkpoint(spec.id) == _in_log(cps[5]) and store.quarantined == []
    store.close()
    assert turns_logged(_log(root, spec.id)) == 5


def test_a_result_is_made_from_its_log_and_a_log_changed_under_the_run_stops_it(
    tmp_path: Path, played: list[tuple[Spec, EpisodeResult]]
) -> None:
    """An episode hands its turns on at their commits; at its end the writer reads them back from the log
    it wrote and writes the result the episode would have held whole. A log edited meanwhile stops the run
    with one line naming it, and keeps the log (the episode resumes from its good lines)."""
    (spec, result), (other_spec, other) = played[0], played[1]
    store = _store(tmp_path)
    for cp in _commits(spec, result):
        store.write_checkpoint(cp)
    store.write_ending(Ending(result.model_copy(update={"turns": ()}), len(result.turns))).result()
    assert store.load_result(spec.id).model_dump_json() == result.model_dump_json()
    assert not _log(tmp_path, spec.id).exists()

    for cp in _commits(other_spec, other):
        store.write_checkpoint(cp)
    store.flush()
    log = _log(tmp_path, other_spec.id)
    log.write_bytes(log.read_bytes().replace(b'"response":"', b'"response":"X', 1))
    store.write_ending(Ending(other.model_copy(update={"turns": ()}), len(other.turns)))
    with pytest.raises(InputError, match="the run's own turn log changed while it ran"):
        store.flush()
    with pytest.raises(InputError):
        store.close()  # released all the same
    assert log.exists() and not (tmp_path / "results" / f"{other_spec.id}.json").exists()


# ---- the writer thread -----------------------------------------------------------------------------


def test_the_writer_keeps_order_commits_in_groups_and_stops_at_its_first_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    monkeypatch.setattr(writer_mod, "fsync", lambda fd: synced.append(fd))
    w = writer_mod.Writer(tmp_path)
    gate = threading.Event()
    w.run(gate.wait)  # holds the thread while the next requests queue up
    log, other = tmp_path / "a.jsonl", tmp_path / "b.json"
    futures = [w.append(log, f"{i}\n".encode()) for i in range(50)]
    w.run(lambda: other.write_text(log.read_text()))  # sees every line asked before it
    futures += [w.append(log, f"{i}\n".encode()) for i in range(50, 60)]
    assert not any(f.done() for f in futures)  # the loop was never made to wait
    gate.set()
    w.flush()
    assert all(f.done() and f.exception() is None for f in futures)
    assert log.read_text() == "".join(f"{i}\n" for i in range(60))
    assert other.read_text() == "".join(f"{i}\n" for i in range(50))
    assert len(synced) <= 3  # group commit: a fsync per file per group, not one per line (60 lines)

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    failed = w.run(full)
    with pytest.raises(DiskFull, match=f"^{tmp_path}: disk full"):
        failed.result()
    with pytest.raises(DiskFull):  # every later request raises it on the caller's side
        w.append(log, b"x\n")
    with pytest.raises(DiskFull):
        w.close()
    assert log.read_text().endswith("59\n")


def test_files_replaced_whole_land_as_a_group_before_what_they_supersede_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """800 results at a paper run's end: written, fsynced side by side with the turn lines of the batch,
    renamed, their folder fsynced once; only then each checkpoint goes; DONE after all of them."""
    events: list[str] = []
    real_fsync = writer_mod.fsync
    monkeypatch.setattr(writer_mod, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(writer_mod, "fsync_dir", lambda folder: events.append(f"dir {folder.name}"))
    w = writer_mod.Writer(tmp_path)
    results, logs = tmp_path / "results", tmp_path / "checkpoints"
    logs.mkdir()
    gate = threading.Event()
    w.run(gate.wait)
    for i in range(20):
        log = logs / f"e{i}.jsonl"
        w.append(log, b"turn\n")
        w.append_only(tmp_path / "calls.jsonl", f"call {i}\n".encode())  # other lines between the results

        def unlink(log: Path = log) -> None:
            events.append(f"unlink {log.name}")
            log.unlink()

        w.replace(results / f"e{i}.json", lambda log=log: log.read_text() * 2, unlink)  # made from its log
    w.run(lambda: events.append(f"DONE sees {len(list(results.iterdir()))}"))
    gate.set()
    w.flush()
    assert [p.read_text() for p in sorted(results.iterdir())] == ["turn\nturn\n"] * 20
    assert not list(logs.iterdir())
    # One group before DONE: the 20 results' fsyncs, their folder's, then the unlinks; the lines' fsyncs
    # (20 logs, the call log) once, at the batch's end.
    assert events[:20] == ["fsync"] * 20 and events[20] == "dir results"
    assert events[21:41] == [f"unlink e{i}.jsonl" for i in range(20)]
    assert events[41:] == ["DONE sees 20"] + ["fsync"] * 21

    # A log started whole then appended to in the same batch (an episode's opening, then its turn 0): the
    # start lands before the line is appended, not over it; a file replaced twice lands in order.
    w.run(gate.wait)
    gate.clear()
    w.run(gate.wait)
    started = logs / "s.jsonl"
    w.replace(started, lambda: "base\n")
    w.append(started, b"turn 0\n")
    w.replace(results / "twice.json", lambda: "first")
    w.replace(results / "twice.json", lambda: "second")
    gate.set()
    w.flush()
    assert started.read_text() == "base\nturn 0\n" and (results / "twice.json").read_text() == "second"
    (results / "twice.json").unlink()
    started.unlink()

    # A result that cannot be made: none of its group lands, no temp file stays, every checkpoint stays.
    w2 = writer_mod.Writer(tmp_path)
    (logs / "a.jsonl").write_text("turn\n")
    (logs / "b.jsonl").write_text("turn\n")
    w2.run(gate.wait)
    done_a = w2.replace(results / "a.json", lambda: "fine", (logs / "a.jsonl").unlink)
    done_b = w2.replace(results / "b.json", lambda: 1 / 0, (logs / "b.jsonl").unlink)  # type: ignore[arg-type,return-value]
    with pytest.raises(ZeroDivisionError):
        w2.flush()
    assert isinstance(done_a.exception(), ZeroDivisionError) and isinstance(done_b.exception(), ZeroDivisionError)
    assert sorted(p.name for p in results.iterdir()) == [f"e{i}.json" for i in sorted(range(20), key=str)]
    assert sorted(p.name for p in logs.iterdir()) == ["a.jsonl", "b.jsonl"]


# ---- the writer's read-back at an episode's end -----------------------------------------------------

# Texts a record's JSON must not be cut at: the keys the read-back finds, quotes, escapes, non-ASCII.
_TRICKY = (
    ',"node_occurred":[',
    ',"turns":[',
    '{"turn":{"turn":0,',
    '"',
    "\\",
    '\\"',
    "\n\r\t\x00\x1f",
    "é ✓ 😀 \u2028",
)


def _text(rng: random.Random) -> str:
    return "".join(rng.choice((*_TRICKY, "a", " ", "word", "9")) for _ in range(rng.randrange(0, 12)))


def _random_turn(rng: random.Random, k: int, facts: int) -> TurnRecord:
    def conflicts() -> list[dict[str, str]]:
        return [
            {"type": rng.choice(["fact", "commitment", "player_input"]), "id": _text(rng), "reason": _text(rng)}
            for _ in range(rng.randrange(3))
        ]

    counts = {"fact": rng.randrange(3), "commitment": 0, "player_input": 1, "total": rng.randrange(4)}
    first, reviewed = conflicts(), rng.random() < 0.4
    return TurnRecord.model_validate(
        {
            "turn": k,
            "player_input": _text(rng),
            "response": _text(rng),
            "fact_update": {
                "add_facts": [_text(rng) for _ in range(rng.randrange(3))],
                "negate_facts": [f"f_{rng.randrange(facts + 2)}" for _ in range(rng.randrange(2))],
                "reason": _text(rng),
            },
            "conflict_check": {"conflicts": first, "counts": counts},
            "double_check": (
                {
                    "conflicts": conflicts(),
                    "confirmed": rng.random() < 0.5,
                    "review_reason": _text(rng),
                    "counts": counts,
                }
                if reviewed
                else None
            ),
            "conflicts": conflicts(),
            "failure_modes": rng.choice([None, [], [{"conflict": "fact:f_1", "mode": "other", "reason": _text(rng)}]]),
            "trajectory_check": rng.choice(
                [
                    None,
                    {"trigger": {"occurred": True, "reason": _text(rng)}, "delta": {"occurred": False, "reason": ""}},
                ]
            ),
            "node_completed": rng.choice([None, _text(rng)]),
            "status_check": rng.choice([None, [{"id": "c1", "status": "PENDING", "reason": _text(rng)}]]),
            "newly_satisfied": rng.choice([[], [_text(rng)]]),
            "back_to_pending": rng.choice([[], ["c1"]]),
            "bound_hits": rng.choice([[], ["narrate:text_chars"]]),
            "thought_tokens": rng.choice([0, 0, rng.randrange(1, 10**12)]),
        }
    )


def _random_episode(seed: int, turns: int) -> tuple[list[Checkpoint], EpisodeResult]:
    """An episode's commits and its whole result, on random records whose states replay as a log's do;
    the narrator's state changes now and then (with floats below 1e-4, which only checkpoints hold)."""
    rng = random.Random(seed)
    state = EpisodeState(
        facts=tuple(FactEntry(id=f"f_{i}", text=_text(rng) or "x", active=True) for i in range(3)),
        node_occurred=(False, False),
        statuses=(("c1", "pending"), ("c2", "pending")),
        pending=FactUpdate(add_facts=("ü",)),
        opening=_text(rng),
    )
    trial = rng.choice([0, 0, 3])
    cps = [Checkpoint(spec_id="s", trial=trial, state=state, opening_update=None, turns=(), narrator_state={})]
    for k in range(turns):
        rec = _random_turn(rng, k, len(state.facts))
        state = ledger.commit_turn(
            state,
            to_update(rec.fact_update),
            (rng.random() < 0.5, k % 3 == 0),
            (("c1", rng.choice(["pending", "satisfied"])), ("c2", "pending")),
            Exchange(player_input=rec.player_input, response=rec.response),
        )
        narrator = (
            {"subgoal": _text(rng), "w": rng.random() * 1e-5, "node_occurred": [k]}
            if rng.random() < 0.3
            else cps[-1].narrator_state
        )
        cps.append(
            cps[-1].model_copy(update={"state": state, "turns": (*cps[-1].turns, rec), "narrator_state": narrator})
        )
    result = EpisodeResult(
        spec_id="s",
        trial=trial,
        termination=rng.choice(["max_turns", "conflict"]),
        reason=_text(rng),
        opening=state.opening,
        opening_update=rng.choice([None, FactUpdateRecord(add_facts=("ä",), negate_facts=(), reason=_text(rng))]),
        turns=cps[-1].turns,
        final_state=state,
        max_turns=turns,
        opening_thought_tokens=rng.choice([0, 7]),
    )
    return cps, result


@pytest.mark.parametrize("seed", range(40))
def test_the_writers_read_back_writes_the_result_the_full_read_writes_byte_for_byte(tmp_path: Path, seed: int) -> None:
    """At an episode's end the writer takes each turn's JSON from the lines it wrote (their hashes checked,
    chained to the last it wrote) and splices them into the head's, instead of validating and replaying
    every line: the file must be the one sealing the whole result writes, for a fresh episode, one resumed
    from its log, one carried over from a format-1 checkpoint (read whole) and one ended with turns not yet
    handed on (a conflict's)."""
    rng = random.Random(seed)
    cps, result = _random_episode(seed, rng.randrange(1, 9))
    name = cps[0].episode
    way = ("fresh", "resumed", "format 1", "tail")[seed % 4]
    handed = max(0, len(result.turns) - (rng.randrange(1, 3) if way == "tail" else 0))
    if way == "format 1":
        _store(tmp_path).close()
        cut = rng.randrange(1, len(cps))
        seal = {"spec_id": "s", **({"trial": cps[0].trial} if cps[0].trial else {}), "spec_sha256": "", "run": RUN}
        seal["sha256"] = _body_hash(cps[cut])
        (tmp_path / "checkpoints" / f"{name}.json").write_text(
            json.dumps({SEAL: seal, **cps[cut].model_dump(mode="json")}, indent=1, ensure_ascii=False)
        )
        store = _store(tmp_path)
        assert store.load_checkpoint(name) == cps[cut]
        cps = cps[cut:]
    elif way == "resumed":
        cut = rng.randrange(1, len(cps))
        _write_all(tmp_path, cps[:cut])
        store = _store(tmp_path)
        assert store.load_checkpoint(name) == _in_log(cps[cut - 1])
        cps = cps[cut:]
    else:
        store = _store(tmp_path)
    for cp in cps:
        if cp.committed <= handed or cp is cps[0]:
            store.write_checkpoint(cp)
    store.flush()
    turns = logged_turns(_log(tmp_path, name), store._chains[name].last, handed)
    assert (turns is None) == (way == "format 1")  # a format-1 base's turns are read whole, by read_log
    store.write_ending(Ending(result.model_copy(update={"turns": result.turns[handed:]}), handed)).result()
    store.close()
    assert (tmp_path / "results" / f"{name}.json").read_bytes() == sealed_json(result, "", RUN)
    if turns is not None:
        assert turns == [t.model_dump_json().encode() for t in result.turns[:handed]]


def test_the_writers_read_back_takes_only_the_lines_it_wrote(
    tmp_path: Path, played: list[tuple[Spec, EpisodeResult]]
) -> None:
    """The read-back trusts a log's lines only when they are the writer's own: an edited line (its hash
    kept, or every hash after it made again), a line cut, added or reordered, or another hash at the end
    sends it to the full read, which names what changed (tests above)."""
    spec, result = played[0]
    _write_all(tmp_path, _commits(spec, result))
    path, n = _log(tmp_path, spec.id), len(result.turns)
    store = _store(tmp_path)
    last = store._chains[spec.id].last
    store.close()
    assert logged_turns(path, last, n) == [t.model_dump_json().encode() for t in result.turns]
    good = path.read_bytes().splitlines(keepends=True)

    def rechained(lines: list[bytes]) -> list[bytes]:
        prev, out = GENESIS, []
        for line in lines:
            body = json.loads(line)["body"]
            framed, prev = _frame(prev, json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode())
            out.append(framed)
        return out

    edited = [*good[:3], good[3].replace(b'"response":"', b'"response":"X', 1), *good[4:]]
    for lines, why in (
        (edited, "edited"),
        (rechained(edited), "edited, its hash and those after it made again"),
        (good[:-1], "cut"),
        ([*good, good[-1]], "a line twice"),
        ([*good[:2], good[3], good[2], *good[4:]], "reordered"),
        ([*good[:-1], good[-1][:-1]], "torn"),
    ):
        path.write_bytes(b"".join(lines))
        assert logged_turns(path, last, n) is None, why
    path.write_bytes(b"".join(good))
    assert logged_turns(path, GENESIS, n) is None and logged_turns(path, last, n - 1) is None


def test_a_result_holds_no_float() -> None:
    """`sealed_json` reads a spliced result's data from its JSON: the same as `model_dump(mode="json")`
    but for inf and nan, which JSON writes null; a result has no field that could hold them."""
    assert '"number"' not in json.dumps(EpisodeResult.model_json_schema())
