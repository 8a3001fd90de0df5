"""The heartbeat (status.json) and `mode=status`: states from hand-made run directories, the stall
threshold, the ETA, the JSON document's documented fields, bad input, and real scripted runs that are
killed, stopped and resumed (rundir/heartbeat.py, execution/heartbeat.py, rundir/status.py, modes/status.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.execution.heartbeat import Counts, Heartbeat
from ncp_local.rundir import heartbeat as hb
from ncp_local.rundir import status as rs
from ncp_local.rundir.heartbeat import WINDOW_S, Beat
from ncp_local.rundir.slurm import tasks_of
from ncp_local.rundir.sweep_index import PointRow, write

ROOT = Path(__file__).resolve().parent.parent
T = rs.Thresholds(stall_s=None, stall_factor=5.0, stall_floor_s=20.0)
NOW = 1_800_000_000.0


def _iso(t: float) -> str:
    return hb.iso(t) or ""


def _run_dir(d: Path, beat: dict | None = None, results: int = 0, checkpoints: int = 0, done: bool = False) -> Path:
    (d / "results").mkdir(parents=True)
    (d / "checkpoints").mkdir()
    (d / "manifest.json").write_text(
        json.dumps({"dataset": {"specs": ["a", "b", "c"]}, "config": {"trials": {"count": 2}}})
    )
    for i in range(results):
        (d / "results" / f"r{i}.json").write_text(json.dumps({"turns": [{}] * 3}))
    for i in range(checkpoints):
        (d / "checkpoints" / f"c{i}.json").write_text(json.dumps({"turns": [{}] * 2}))
    if done:
        (d / "DONE").write_text("")
    if beat is not None:
        (d / "status.json").write_text(json.dumps(beat))
    return d


def _beat(**over: object) -> dict:
    base = Beat(
        state="running",
        every_s=5.0,
        episodes_finished=1,
        episodes_total=6,
        turns_committed=40,
        turns_possible=100,
        calls_per_s=2.0,
        tokens_per_s=900.0,
        turns_per_s=0.5,
        last_turn_at=_iso(NOW - 3),
        last_call_at=_iso(NOW - 1),
        playing_since=_iso(NOW - 600),
        turn_seconds=[2.0] * 9 + [8.0],
        host="elsewhere",  # not this host: the pid says nothing
        pid=1,
        started_at=_iso(NOW - 700),
        updated_at=_iso(NOW - 2),
    ).model_dump()
    return {**base, **over}


def _row(d: Path, now: float = NOW, t: rs.Thresholds = T) -> rs.Row:
    (row,) = rs.rows_for(str(d), t, now, slurm=False)
    return row


# ---- the reader --------------------------------------------------------------------


def test_a_working_run_is_running_with_its_rates_and_eta(tmp_path: Path) -> None:
    row = _row(_run_dir(tmp_path / "r", _beat(), results=1))
    assert row.state == "running" and row.line is None
    assert (row.episodes_finished, row.episodes_total, row.turns_committed, row.turns_possible) == (1, 6, 40, 100)
    assert row.eta_s == pytest.approx(60 / 0.5)  # turns left at the observed turn rate
    assert row.calls_per_s == 2.0 and row.since_turn_s == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("turn_seconds", "cfg", "expected"),
    [
        ([], T, 20.0),  # no turn yet: the floor
        ([2.0] * 9 + [8.0], T, 20.0),  # 5 x p90 (2.0) = 10 < floor
        ([2.0] * 8 + [8.0, 9.0], T, 40.0),  # p90 of ten is the 9th smallest: 8.0; 5 x 8
        ([30.0], T, 150.0),
        ([30.0], rs.Thresholds(stall_s=7.0), 7.0),  # the override wins, whatever the turns
    ],
)
def test_the_stall_threshold_comes_from_the_runs_own_turns(
    turn_seconds: list, cfg: rs.Thresholds, expected: float
) -> None:
    assert rs.stall_threshold(turn_seconds, cfg) == pytest.approx(expected)


def test_quantile_is_an_observed_value_and_monotone() -> None:
    values = [float(x) for x in (5, 1, 9, 3, 7, 2, 8)]
    qs = [rs.quantile(values, q) for q in (0.1, 0.5, 0.9, 1.0)]
    assert all(q in values for q in qs) and qs == sorted(qs) and qs[-1] == 9.0


def test_no_turn_and_no_call_past_the_threshold_is_stalled(tmp_path: Path) -> None:
    beat = _beat(last_turn_at=_iso(NOW - 50), last_call_at=_iso(NOW - 45), turn_seconds=[2.0] * 10)
    row = _row(_run_dir(tmp_path / "r", beat))
    assert row.state == "stalled" and row.stall_s == 20.0 and row.eta_s is None
    assert "for 45 s (threshold 20 s)" in (row.line or "")
    # Just inside the threshold it still runs: a call completed 19 s ago.
    row = _row(_run_dir(tmp_path / "s", {**beat, "last_call_at": _iso(NOW - 19)}))
    assert row.state == "running"


def test_engine_loading_is_not_a_stall(tmp_path: Path) -> None:
    beat = _beat(playing_since=None, last_turn_at=None, last_call_at=None, started_at=_iso(NOW - 900))
    row = _row(_run_dir(tmp_path / "r", beat))
    assert row.state == "running" and "loading engines" in (row.line or "")


def test_a_stale_heartbeat_with_no_final_state_is_failed(tmp_path: Path) -> None:
    row = _row(_run_dir(tmp_path / "r", _beat(updated_at=_iso(NOW - 60))))  # > 3 x 5 s + 10 s
    assert row.state == "failed" and "no final state" in (row.line or "")
    # The same age inside the limit: still running.
    assert _row(_run_dir(tmp_path / "s", _beat(updated_at=_iso(NOW - 20)))).state == "running"


def test_a_dead_pid_on_this_host_is_failed_at_once(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    row = _row(_run_dir(tmp_path / "r", _beat(host=socket.gethostname(), pid=dead.pid)))
    assert row.state == "failed" and f"process {dead.pid}" in (row.line or "")
    # A live pid on this host with a stale heartbeat is not failed: the process is there (stopped, hung).
    alive = _beat(host=socket.gethostname(), pid=os.getpid(), updated_at=_iso(NOW - 60))
    assert _row(_run_dir(tmp_path / "s", alive)).state == "running"


def test_final_states_carry_their_exit_and_line(tmp_path: Path) -> None:
    failed = _beat(state="failed", exit_code=3, error="engine died: boom", updated_at=_iso(NOW - 5000))
    row = _row(_run_dir(tmp_path / "r", failed))
    assert (row.state, row.exit_code, row.line) == ("failed", 3, "engine died: boom")
    stopped = _beat(state="stopped", exit_code=143, error="stopped by SIGTERM")
    assert _row(_run_dir(tmp_path / "s", stopped)).state == "stopped"
    assert _row(_run_dir(tmp_path / "d", _beat(state="done"), results=6, done=True)).state == "done"


def test_without_a_heartbeat_the_files_say_it(tmp_path: Path) -> None:
    done = _row(_run_dir(tmp_path / "d", results=6, done=True))
    assert (done.state, done.episodes_finished, done.episodes_total, done.turns_committed) == ("done", 6, 6, 18)
    assert _row(_run_dir(tmp_path / "q")).state == "queued"
    part = _row(_run_dir(tmp_path / "p", results=1, checkpoints=1))
    assert part.state == "stopped" and part.turns_committed == 5


def test_a_sharded_run_with_its_submission_record_and_task_logs(tmp_path: Path) -> None:
    """Rows per shard, the submitted shard count naming the missing one, the task log's exit and restarts."""
    root = tmp_path / "run"
    _run_dir(root / "shard-000-of-003", _beat(state="done"), results=2, done=True)
    _run_dir(root / "shard-001-of-003", _beat(updated_at=_iso(NOW - 300)), results=1)
    (root / "submit.json").write_text(
        json.dumps(
            {"identity": "x", "shards": 3, "jobs": [{"job": "41", "tasks": [0, 1, 2]}, {"job": "42", "tasks": [1]}]}
        )
    )
    (root / "slurm").mkdir()
    (root / "slurm" / "42_1.out").write_text(
        "ncp: task 42_1 on n1 (restart 0) at x\nncp: task 42_1 on n1 (restart 1) at x\n"
        "error: engine died: the engine process exited\nncp: task 42_1 exit 3 at y\n"
    )
    rows = rs.rows_for(str(root), T, NOW, slurm=False)
    assert [(r.name, r.state) for r in rows] == [
        ("run shard-000-of-003", "done"),
        ("run shard-001-of-003", "failed"),
        ("run shard-002-of-003", "queued"),
    ]
    assert rows[1].exit_code == 3 and rows[1].line == "error: engine died: the engine process exited"
    assert rows[1].slurm is not None and rows[1].slurm["job"] == "42" and rows[1].slurm["restarts"] == 1
    tasks = tasks_of(root, 3, slurm=False)
    assert tasks[0].job == "41" and tasks[1].job == "42" and tasks[1].exit_code == 3


def test_a_sweep_folder_has_a_row_per_point(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _run_dir(tmp_path / "p0", _beat(state="done"), results=6, done=True)
    _run_dir(tmp_path / "p1", _beat())
    rows = [
        PointRow(job=0, overrides=("seed=0", "limit=3"), run_dir=str(tmp_path / "p0"), status="done"),
        PointRow(job=1, overrides=("seed=1", "limit=3"), run_dir=str(tmp_path / "p1"), status="running"),
        PointRow(job=2, overrides=("seed=2", "limit=3"), run_dir=str(tmp_path / "p2"), status="pending"),
        PointRow(job=3, overrides=("seed=3", "limit=3"), status="failed", exit_code=2, error="dataset: no such"),
    ]
    write(sweep, rows, [], [[0, 1, 2, 3]], "batched")
    got = rs.rows_for(str(sweep), T, NOW, slurm=False)
    assert [(r.name, r.state) for r in got] == [
        ("#0 seed=0", "done"),
        ("#1 seed=1", "running"),
        ("#2 seed=2", "queued"),
        ("#3 seed=3", "failed"),
    ]
    assert got[3].exit_code == 2 and got[3].line == "dataset: no such"


def test_the_total_row(tmp_path: Path) -> None:
    a = _row(_run_dir(tmp_path / "a", _beat()))
    b = _row(_run_dir(tmp_path / "b", _beat(turns_committed=90, turns_per_s=1.0)))
    c = _row(_run_dir(tmp_path / "c", _beat(last_turn_at=_iso(NOW - 99), last_call_at=_iso(NOW - 99))))
    tot = rs.total([a, b, c])
    assert tot.states == {"running": 2, "stalled": 1}
    assert (tot.turns_committed, tot.turns_possible, tot.episodes_total) == (170, 300, 18)
    # The slowest running row (a: 60 turns at 0.5/s) bounds it; the stalled row's work is said apart.
    assert tot.eta_s == pytest.approx(120.0) and tot.eta_excludes == 1
    assert tot.calls_per_s == pytest.approx(4.0)  # the stalled row's rate is not counted


def test_the_json_document_has_the_documented_fields(tmp_path: Path) -> None:
    """docs/reference/status.md lists every field of a row and of the total; the document has exactly those."""
    _run_dir(tmp_path / "a", _beat())
    out = run_cli("mode=status", f"runs=[{tmp_path}/a]", "status.format=json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    text = (ROOT / "docs" / "reference" / "status.md").read_text(encoding="utf-8")
    documented = {
        part: re.findall(r"^\| `([a-z_]+)` \|", text.split(f"<!-- {part} -->")[1].split("<!-- end -->")[0], re.M)
        for part in ("document", "row", "total")
    }
    assert list(doc) == documented["document"]
    assert list(doc["rows"][0]) == documented["row"]
    assert list(doc["total"]) == documented["total"]
    assert doc["kind"] == "ncp-status" and doc["version"] == 1 and doc["rows"][0]["state"] in rs.STATES


# A library speaking while mode=status reads the runs, and once more as the process exits: a log record, a
# warning and a print. `mode=status` calls `status_rows` once.
NOISY = """
import atexit, logging, sys, warnings
import ncp_local.modes.status as status
read = status.status_rows
def noisy(*args, **kwargs):
    logging.getLogger("urllib3.connectionpool").warning("LIB-LOG: a library's warning")
    warnings.warn("LIB-WARN: a library's warning")
    print("LIB-PRINT: a library's print")
    return read(*args, **kwargs)
status.status_rows = noisy
atexit.register(lambda: logging.getLogger("some.library").warning("LIB-EXIT: logged as the process exits"))
sys.argv = ["run.py", *sys.argv[1:]]
from ncp_local.launch.cli import main
main()
"""


@pytest.mark.parametrize("verbose", ["false", "true"])
def test_the_json_document_is_alone_on_stdout_while_libraries_log(tmp_path: Path, verbose: str) -> None:
    """docs/reference/status.md: the document is the whole of stdout; what else is written goes to stderr, or to
    the mode's log while the terminal is quiet (verbose=false). A real process: Hydra's logging as configured."""
    _run_dir(tmp_path / "a", _beat())
    env = {**os.environ, "NCP_LOCAL_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            NOISY,
            "mode=status",
            f"runs=[{tmp_path}/a]",
            "status.format=json",
            f"verbose={verbose}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # the whole of stdout
    assert doc["kind"] == "ncp-status" and doc["rows"][0]["state"] in rs.STATES
    logged = out.stderr + "".join(p.read_text() for p in (tmp_path / "cache").glob("logs/*.log"))
    for line in ("LIB-LOG", "LIB-WARN", "LIB-PRINT", "LIB-EXIT"):
        assert line in logged, line  # moved, never lost
    if verbose == "true":  # nothing quiets the terminal: all of it on stderr
        assert all(line in out.stderr for line in ("LIB-LOG", "LIB-WARN", "LIB-PRINT", "LIB-EXIT")), out.stderr


def test_not_a_run_directory_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    for entry in (tmp_path / "other", tmp_path / "absent", f"{tmp_path}/nothing-*"):
        out = run_cli("mode=status", f"runs=[{entry}]", cwd=tmp_path)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.startswith("error: ") and out.stderr.strip().count("\n") == 0 and "runs" in out.stderr


def test_status_imports_no_model_library(tmp_path: Path) -> None:
    _run_dir(tmp_path / "a", _beat())
    code = (
        "import sys; sys.argv=['run.py','mode=status','runs=[" + str(tmp_path / "a") + "]'];"
        "from ncp_local.launch.cli import main\n"
        "try:\n main()\nexcept SystemExit:\n pass\n"
        "bad=[m for m in ('vllm','torch','transformers') if m in sys.modules]; print('LOADED', bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "LOADED []" in out.stdout, out.stdout + out.stderr


# ---- the writer --------------------------------------------------------------------


def test_a_heartbeat_that_cannot_be_written_warns_once_and_never_raises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ro").write_text("a file where the run directory should be")
    beat = Heartbeat(tmp_path / "ro", lambda: Counts(0, 1, 0, 3), every_s=0.05)
    beat.start()
    time.sleep(0.3)
    beat.finish("done")
    assert capsys.readouterr().err.count("heartbeat not written") == 1


def test_the_heartbeat_measures_turns_between_commits_of_one_episode(tmp_path: Path) -> None:
    clock = iter([0.0, 10.0, 12.0, 13.0, 15.0, 16.0, 20.0]).__next__
    beat = Heartbeat(tmp_path, lambda: Counts(0, 2, 3, 6), every_s=60, wall=clock)  # started at 0
    beat.playing()  # 10
    beat.turn("a", 1)  # 12: a's first commit, no duration yet
    beat.turn("b", 1)  # 13
    beat.turn("a", 1)  # 15: 3 s for a's turn
    beat.turn("b", 0)  # a resumed checkpoint reported: nothing new, no clock read
    beat.turn("b", 2)  # 16: two turns in 3 s: 1.5 s each
    snap = beat.snapshot()  # 20
    assert snap.turn_seconds == [3.0, 1.5] and snap.turns_per_s == pytest.approx(5 / 10)


def _final(run: Path) -> tuple[str, int | None, str]:
    beat = json.loads((run / "status.json").read_text())
    return beat["state"], beat["exit_code"], beat["error"] or ""


def test_the_final_heartbeat_says_the_exit_code_of_every_way_a_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window_fills: Callable[[], None]
) -> None:
    """Done (0), done again with nothing left to do (0), an engine death (3), a run that measured nothing
    (5) and the same run again (5 again, its heartbeat rewritten), and a batched sweep's points (5 each): the
    final status.json and mode=status say the process's exit code and state. (143: the real-process test below.)"""
    monkeypatch.chdir(tmp_path)
    base = ("engine=scripted", "limit=2", "max_turns=2", "progress=false", "status.heartbeat_s=0.5")
    ok = run_cli(*base, f"out_dir={tmp_path / 'ok'}")
    assert ok.returncode == 0, ok.stderr
    assert _final(tmp_path / "ok") == ("done", 0, "")
    (tmp_path / "ok" / "status.json").write_text(json.dumps(_beat(state="stopped", exit_code=143)))
    again = run_cli(*base, f"out_dir={tmp_path / 'ok'}")
    assert again.returncode == 0 and "nothing left to do" in again.stdout
    assert _final(tmp_path / "ok") == ("done", 0, "")  # this command's end, not the one left before

    dead = run_cli(*base, "engine.die_after_calls=5", f"out_dir={tmp_path / 'dead'}")
    assert dead.returncode == 3, dead.stderr
    state, code, line = _final(tmp_path / "dead")
    assert (state, code) == ("failed", 3) and line.startswith("engine died")

    window_fills()
    for attempt in range(2):  # played, then every result already on disk: the same verdict, the same exit
        empty = run_cli(*base, "limit=1", f"out_dir={tmp_path / 'empty'}")
        assert empty.returncode == 5, (attempt, empty.stderr)
        state, code, line = _final(tmp_path / "empty")
        assert (state, code) == ("failed", 5) and "context_limit before their first committed turn" in line
        row = _status(tmp_path, tmp_path / "empty")
        assert (row["state"], row["exit_code"]) == ("failed", 5)
    assert "nothing left to do" in empty.stdout

    sweep = run_cli("-m", "hydra/launcher=batched", *base, "limit=1", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert sweep.returncode == 6, sweep.stderr
    beats = sorted((tmp_path / "runs").rglob("status.json"))
    assert len(beats) == 2 and {_final(b.parent)[:2] for b in beats} == {("failed", 5)}


# ---- real runs ---------------------------------------------------------------------


def _start(tmp_path: Path, name: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / name
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "engine=scripted",
        f"out_dir={out}",
        "progress=false",
        "status.heartbeat_s=0.5",
        *extra,
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, out


def _status(tmp_path: Path, run: Path, *extra: str) -> dict:
    out = run_cli("mode=status", f"runs=[{run}]", "status.format=json", *extra, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["rows"][0]


def _until(what, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail("timed out")


@pytest.mark.timeout(300)
def test_runs_killed_stopped_and_terminated(tmp_path: Path) -> None:
    """Three scripted runs at once: SIGSTOPped then resumed (running, stopped within one heartbeat with the
    command that resumes it, running, done), SIGKILLed (failed: its pid is gone, finished = results on
    disk, the log to read), SIGTERMed (stopped, exit 143, the line that says so)."""
    slow = ("engine.delay_s=0.05", "limit=2", "max_turns=12", "concurrency=2")
    stop, stop_dir = _start(tmp_path, "stop", *slow)
    kill, kill_dir = _start(tmp_path, "kill", *slow, "max_turns=40")
    term, term_dir = _start(tmp_path, "term", *slow, "max_turns=40")
    try:
        for d in (stop_dir, kill_dir, term_dir):
            _until(
                lambda d=d: (
                    (d / "status.json").exists() and json.loads((d / "status.json").read_text())["turns_committed"] >= 2
                )
            )
        # The threshold from the run's own turns (a fraction of a second each) with a 6 s floor (a busy CI
        # machine can leave a healthy run without a turn for a few seconds).
        threshold = ("status.stall_floor_s=6",)
        assert _status(tmp_path, stop_dir, *threshold)["state"] == "running"
        os.kill(stop.pid, signal.SIGSTOP)
        os.kill(kill.pid, signal.SIGKILL)
        os.kill(term.pid, signal.SIGTERM)
        started = time.monotonic()
        frozen = _until(lambda: (r := _status(tmp_path, stop_dir, *threshold))["state"] == "stopped" and r, 60)
        assert time.monotonic() - started < 5.0  # within one heartbeat (5 s): /proc says it, not the beat's age
        assert "SIGSTOP" in frozen["line"] and frozen["next"] == f"kill -CONT {stop.pid} resumes it where it was"
        killed = _status(tmp_path, kill_dir)
        assert killed["state"] == "failed" and f"process {kill.pid}" in killed["line"], killed
        on_disk = len(list((kill_dir / "results").glob("*.json")))
        assert killed["episodes_finished"] == on_disk and "re-run its command" in killed["next"]
        assert term.wait(60) == 143
        termed = _status(tmp_path, term_dir)
        assert (termed["state"], termed["exit_code"], termed["line"]) == ("stopped", 143, "stopped by SIGTERM")
        os.kill(stop.pid, signal.SIGCONT)
        _until(lambda: _status(tmp_path, stop_dir, *threshold)["state"] in ("running", "done"), 60)
        assert stop.wait(120) == 0
        done = _status(tmp_path, stop_dir)
        assert done["state"] == "done" and done["episodes_finished"] == done["episodes_total"] == 2
        assert done["turns_committed"] == done["turns_possible"] > 0
    finally:
        for p in (stop, kill, term):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()


def _rows(tmp_path: Path, entry: Path | str) -> list[dict]:
    out = run_cli("mode=status", f"runs=[{entry}]", "status.format=json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["rows"]


@pytest.mark.timeout(300)
def test_a_basic_launcher_sweep_is_watched_from_its_first_point(tmp_path: Path) -> None:
    """Every point listed while the first plays, each point's folder linking to its run, the second point
    running after the first is done, and a glob over the sweeps' folder reading it."""
    sweep = tmp_path / "multirun" / "sw"
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", "engine=scripted", "engine.delay_s=0.05", "limit=1"]
    cmd += ["max_turns=12", "concurrency=1", "progress=false", "status.heartbeat_s=0.5", "seed=0,1,2"]
    proc = subprocess.Popen([*cmd, f"hydra.sweep.dir={sweep}"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        first = _until(lambda: (sweep / "index.json").exists() and _rows(tmp_path, sweep))
        assert [r["name"] for r in first] == ["#0 seed=0", "#1 seed=1", "#2 seed=2"]
        assert [r["state"] for r in first] == ["running", "queued", "queued"], first
        assert all(r["next"] for r in first[1:])
        assert (sweep / "0" / "run").resolve() == Path(first[0]["path"]).resolve()
        second = _until(lambda: (rows := _rows(tmp_path, sweep))[1]["state"] == "running" and rows, 120)
        assert second[0]["state"] == "done" and second[2]["state"] == "queued"
        assert proc.wait(120) == 0
        both = _rows(tmp_path, tmp_path / "multirun" / "*")
        assert [r["state"] for r in both] == ["done"] * 3
        assert all((sweep / str(n) / "run" / "DONE").exists() for n in range(3))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_point_without_a_heartbeat_follows_the_sweeps_process(tmp_path: Path) -> None:
    """The basic launcher's point that is starting (no heartbeat yet) and the points after it: running and
    queued while the sweep's process lives, queued with `kill -CONT` while it is stopped, failed and
    stopped (re-run the sweep) once it is gone."""
    sweep = tmp_path / "sweep"
    (tmp_path / "p0" / "results").mkdir(parents=True)
    rows = [
        PointRow(job=0, overrides=("seed=0",), run_dir=str(tmp_path / "p0"), status="running"),
        PointRow(job=1, overrides=("seed=1",), status="waiting"),
    ]
    write(sweep, rows, [], [], "basic")
    index = json.loads((sweep / "index.json").read_text())
    proc = subprocess.Popen(["sleep", "60"])
    try:
        seen = {}
        for how in ("alive", "stopped", "gone"):
            if how == "stopped":
                os.kill(proc.pid, signal.SIGSTOP)
                _until(lambda: rs.pid_state(proc.pid, index["host"]) == "stopped", 5)
            if how == "gone":
                proc.kill()
                proc.wait()
            (sweep / "index.json").write_text(json.dumps({**index, "pid": proc.pid}))
            got = rs.rows_for(str(sweep), T, time.time(), slurm=False)
            seen[how] = [(r.state, r.next) for r in got]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [s for s, _ in seen["alive"]] == ["running", "queued"]
    assert seen["stopped"][1] == ("queued", f"kill -CONT {proc.pid} resumes the sweep")
    assert [s for s, _ in seen["gone"]] == ["failed", "stopped"]
    assert all("re-run the sweep's command" in (n or "") for _, n in seen["gone"])
    assert (sweep / "0" / "run").resolve() == (tmp_path / "p0").resolve()  # the point's folder says where its run is


def test_a_point_whose_run_is_its_folder_gets_no_link(tmp_path: Path) -> None:
    """out_dir=${hydra:sweep.dir}/${hydra:job.num}: the run is the point's folder, which must stay a run's."""
    sweep = tmp_path / "sweep"
    write(sweep, [PointRow(job=0, run_dir=str(sweep / "0"), status="running")], [], [], "basic")
    write(sweep, [PointRow(job=1, run_dir=str(sweep / "1" / "r"), status="running")], [], [], "basic")
    assert not (sweep / "0").exists() and not (sweep / "1" / "run").exists()


def test_the_heartbeats_window_holds_a_bucket_a_second_however_many_calls(tmp_path: Path) -> None:
    now = [0.0]
    beat = Heartbeat(tmp_path, lambda: Counts(0, 1, 0, 3), every_s=60, wall=lambda: now[0])
    beat.playing()
    for i in range(20_000):  # 2,000 calls a second for 10 s, 3 tokens each
        now[0] = 100.0 + i / 2_000
        beat.call(3)
    now[0] = 110.0
    snap = beat.snapshot()
    assert len(beat._calls) == 10 and beat.calls == 20_000
    assert snap.calls_per_s == pytest.approx(20_000 / 110) and snap.tokens_per_s == pytest.approx(
        60_000 / 110, abs=0.01
    )
    now[0] = 100.0 + WINDOW_S + 5.5  # seconds 100-104 have left the window; 105, half in it, counts whole
    snap = beat.snapshot()
    assert len(beat._calls) == 5 and snap.calls_per_s == pytest.approx(10_000 / WINDOW_S, abs=1e-4)
