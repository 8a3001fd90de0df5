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
from ncp_local.protocol.episode import Ending
from ncp_local.protocol.records import Checkpoint, EpisodeResult
from ncp_local.protocol.replay import replay
from ncp_local.protocol.spec import Spec, load_spec
from ncp_local.rundir import writer as writer_mod
from ncp_local.rundir.atomic import DiskFull
from ncp_local.rundir.formats import FORMAT_KEY
from ncp_local.rundir.seals import SEAL, _body_hash
from ncp_local.rundir.store import RunDir, RunMismatch
from ncp_local.rundir.turn_log import SUFFIX, read_log, turns_logged

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
