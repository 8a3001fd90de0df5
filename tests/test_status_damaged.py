"""`mode=status` reads every record as untrusted input: a damaged heartbeat, submission record, sweep
index, task log, Slurm answer or result file gives a row that names it (or one line, exit 2, for a
named entry that is no run), never a traceback and never unbounded work; a bad `status.watch` or
`status.heartbeat_s` is one line, exit 2 (rundir/heartbeat.py, rundir/slurm.py, rundir/status.py).

Each case builds a run directory, a sharded run or a sweep folder in `tmp_path`, damages one record,
and says what the reading must give: the state of the row it concerns and a phrase of its line. Every
case is also drawn as the table and the JSON document, and must be read within `BOUND_S`.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.modes.status import table
from ncp_local.rundir import heartbeat as hb
from ncp_local.rundir import slurm as st
from ncp_local.rundir import status as rs
from ncp_local.rundir.sweep_index import PointRow, write

T = rs.Thresholds(stall_s=None, stall_factor=5.0, stall_floor_s=20.0)
NOW = time.time()
BOUND_S = 10.0


def _beat(**over: object) -> dict:
    base = hb.Beat(
        state="running",
        every_s=5.0,
        episodes_finished=1,
        episodes_total=6,
        turns_committed=40,
        turns_possible=100,
        turns_per_s=0.5,
        last_turn_at=hb.iso(NOW - 3),
        last_call_at=hb.iso(NOW - 1),
        playing_since=hb.iso(NOW - 600),
        host="elsewhere",
        pid=1,
        started_at=hb.iso(NOW - 700) or "",
        updated_at=hb.iso(NOW - 2) or "",
    ).model_dump()
    return {**base, **over}


def _run(d: Path, status: bytes | str | None = None, results: int = 1, checkpoints: int = 1) -> Path:
    (d / "results").mkdir(parents=True)
    (d / "checkpoints").mkdir()
    (d / "manifest.json").write_text(json.dumps({"dataset": {"specs": ["a", "b", "c"]}}))
    for i in range(results):
        (d / "results" / f"r{i}.json").write_text(json.dumps({"turns": [{}] * 3}))
    for i in range(checkpoints):
        (d / "checkpoints" / f"c{i}.json").write_text(json.dumps({"turns": [{}] * 2}))
    if status is not None:
        (d / "status.json").write_bytes(status.encode() if isinstance(status, str) else status)
    return d


def _heartbeat(text: bytes | str) -> Callable[[Path], Path]:
    return lambda tmp: _run(tmp / "run", text)


def _beat_with(**over: object) -> Callable[[Path], Path]:
    return _heartbeat(json.dumps(_beat(**over)))


def _sharded(record: object, raw: bytes | None = None, shards: int = 2) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        root = tmp / "sharded"
        for i in range(shards):
            _run(root / f"shard-{i:03d}-of-{shards:03d}")
        (root / "submit.json").write_bytes(raw if raw is not None else json.dumps(record).encode())
        return root

    return build


def _good_record(**over: object) -> dict:
    return {"identity": "x", "shards": 2, "jobs": [{"job": "101", "tasks": [0, 1]}], **over}


def _sweep(text: bytes | None = None, rows: list[PointRow] | None = None) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        sweep = tmp / "sweep"
        if rows is not None:
            write(sweep, rows, [], [], "basic")
        else:
            sweep.mkdir()
            (sweep / "index.json").write_bytes(text or b"")
        return sweep

    return build


def _index_of(**over: object) -> bytes:
    doc = {
        "kind": "ncp-sweep",
        "format_version": 1,
        "points": [{"job": 0, "run_dir": "/nonexistent", "status": "running"}],
    }
    return json.dumps({**doc, **over}).encode()


def _with_file(build: Callable[[Path], Path], name: str, data: bytes) -> Callable[[Path], Path]:
    def built(tmp: Path) -> Path:
        root = build(tmp)
        (root / name).write_bytes(data)
        return root

    return built


def _status_dir(tmp: Path) -> Path:
    d = _run(tmp / "run")
    (d / "status.json").mkdir()
    return d


def _deep_result(tmp: Path) -> Path:
    d = _run(tmp / "run", results=0, checkpoints=0)
    (d / "checkpoints" / "deep.json").write_text("[" * 200_000)
    (d / "results" / "deep.json").write_text('{"turns": ' + "[" * 200_000)
    (d / "manifest.json").write_text('{"dataset": ' + "[" * 200_000)
    return d


def _odd_checkpoints(tmp: Path) -> Path:
    d = _run(tmp / "run", results=0, checkpoints=0)
    (d / "checkpoints" / "a.json").mkdir()
    (d / "checkpoints" / "b.json").write_text('{"turns": "three"}')
    (d / "checkpoints" / "c.json").write_bytes(b"\xff\xfe\x00")
    return d


def _turn_logs(tmp: Path) -> Path:
    d = _run(tmp / "run", results=0, checkpoints=0)
    (d / "checkpoints" / "a.jsonl").write_text("not a frame\n" * 3)
    body = "[" * 200_000
    (d / "checkpoints" / "b.jsonl").write_text(
        '{"sha256":"' + "0" * 64 + '","prev":"' + "0" * 64 + '","body":' + body + "}\n"
    )
    (d / "checkpoints" / "c.jsonl").write_bytes(b"")
    return d


def _manifest(doc: object) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        d = _run(tmp / "run", results=0, checkpoints=0)
        (d / "manifest.json").write_text(json.dumps(doc))
        return d

    return build


def _many_jobs(tmp: Path) -> Path:
    root = tmp / "sharded"
    _run(root / "shard-000-of-002")
    jobs = [{"job": str(1000 + i), "tasks": [i % 2]} for i in range(50_000)]
    (root / "submit.json").write_text(json.dumps({"identity": "x", "shards": 2, "jobs": jobs}))
    return root


def _task_log(text: bytes) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        root = _sharded(_good_record())(tmp)
        (root / "slurm").mkdir()
        (root / "slurm" / "101_0.out").write_bytes(text)
        return root

    return build


def _glob_with_damage(tmp: Path) -> Path:
    _run(tmp / "all" / "good", json.dumps(_beat()))
    (tmp / "all" / "empty").mkdir()  # no run at all: left out
    _sweep(b"{")(tmp / "all")
    return tmp / "all" / "*"


@dataclass(frozen=True)
class Case:
    build: Callable[[Path], Path]
    state: str  # the state of the row the damage concerns
    says: str  # a phrase of that row's line (or next)
    row: int = 0  # which row


CASES: dict[str, Case] = {
    # -- the heartbeat (status.json) --
    "heartbeat empty": Case(_heartbeat(""), "stopped", "status.json damaged (empty)"),
    "heartbeat whitespace": Case(_heartbeat(" \n"), "stopped", "damaged (empty)"),
    "heartbeat truncated": Case(_heartbeat(json.dumps(_beat())[:40]), "stopped", "damaged (not JSON"),
    "heartbeat a list": Case(_heartbeat("[1, 2]"), "stopped", "a JSON list, not an object"),
    "heartbeat a number": Case(_heartbeat("42"), "stopped", "a JSON int, not an object"),
    "heartbeat not UTF-8": Case(_heartbeat(b"\xff\xfe{}"), "stopped", "damaged (not JSON"),
    "heartbeat nested 200k deep": Case(_heartbeat("[" * 200_000), "stopped", "damaged (not JSON"),
    "heartbeat larger than 256 kB": Case(
        _beat_with(turn_seconds=[1.0] * 60_000), "stopped", "damaged (larger than 256 kB)"
    ),
    "heartbeat a directory": Case(_status_dir, "stopped", "damaged (unreadable"),
    "times that are no times": Case(
        _beat_with(last_turn_at="yesterday", last_call_at="x", playing_since="?", started_at="", updated_at="soon"),
        "stopped",
        "is not a time",
    ),
    "updated far in the future": Case(_beat_with(updated_at="9999-12-31T00:00:00+00:00"), "stopped", "in the future"),
    "year 0 time": Case(_beat_with(updated_at="0000-01-01T00:00:00"), "stopped", "is not a time"),
    "negative episodes": Case(_beat_with(episodes_finished=-3), "stopped", "episodes_finished"),
    "NaN rate": Case(
        _heartbeat(json.dumps(_beat()).replace('"calls_per_s": 0.0', '"calls_per_s": NaN')), "stopped", "calls_per_s"
    ),  # fmt: skip
    "every_s Infinity": Case(
        _heartbeat(json.dumps(_beat()).replace('"every_s": 5.0', '"every_s": Infinity')), "stopped", "every_s"
    ),  # fmt: skip
    "every_s 0": Case(_beat_with(every_s=0), "stopped", "every_s"),
    "pid 10**30": Case(_beat_with(pid=10**30, host=os.uname().nodename), "stopped", "pid"),
    "pid negative": Case(_beat_with(pid=-5), "stopped", "pid"),
    "state unknown": Case(_beat_with(state="exploded"), "stopped", "not one of running"),
    "exit code 99999": Case(_beat_with(state="failed", exit_code=99_999), "stopped", "exit_code"),
    "slurm ids not strings": Case(_beat_with(slurm={"job_id": [1]}), "stopped", "slurm"),
    "negative turn durations": Case(_beat_with(turn_seconds=[-1.0]), "stopped", "negative turn duration"),
    "more turns than possible": Case(_beat_with(turns_committed=500, turns_possible=10), "running", ""),
    "no turn nor call for 600 s": Case(
        _beat_with(last_turn_at=None, last_call_at=None, started_at=""), "stalled", "no committed turn"
    ),
    "no moment at all": Case(
        _beat_with(last_turn_at=None, last_call_at=None, started_at="", playing_since="", updated_at=""), "running", ""
    ),  # the max() of nothing, once a ValueError
    # -- the submission record (submit.json) --
    "shards 1,000,000,000": Case(
        _sharded(_good_record(shards=1_000_000_000)), "damaged", "less than or equal to 10000"
    ),
    "shards a string": Case(_sharded(_good_record(shards="2")), "damaged", "shards"),
    "shards true": Case(_sharded(_good_record(shards=True)), "damaged", "shards"),
    "shards 0": Case(_sharded(_good_record(shards=0)), "damaged", "shards"),
    "jobs not a list": Case(_sharded(_good_record(jobs="101")), "damaged", "jobs"),
    "job id an option": Case(_sharded(_good_record(jobs=[{"job": "--help", "tasks": [0]}])), "damaged", "jobs.0.job"),
    "task index past the shards": Case(
        _sharded(_good_record(jobs=[{"job": "1", "tasks": [7]}])), "damaged", "not below its 2 shards"
    ),  # fmt: skip
    "task index a word": Case(_sharded(_good_record(jobs=[{"job": "1", "tasks": ["x"]}])), "damaged", "tasks"),
    "submit.json empty": Case(_sharded(None, raw=b""), "damaged", "not JSON"),
    "submit.json a list": Case(_sharded(None, raw=b"[]"), "damaged", "a JSON list"),
    "submit.json no identity": Case(_sharded({"shards": 2}), "damaged", "identity"),
    "50,000 jobs recorded": Case(_many_jobs, "damaged", "at most 10000 items"),
    # -- the task logs --
    "task log 5 MB without a newline": Case(_task_log(b"x" * 5_000_000), "stopped", "not running"),
    "task log garbage restart line": Case(
        _task_log(b"ncp: task 1 on n (restart 99999999999999999999)\nncp: task 1 exit 7\n"), "failed", "exit 7"
    ),
    # -- the sweep index --
    "index not JSON": Case(_sweep(b"{"), "damaged", "cannot read the sweep index"),
    "index empty": Case(_sweep(b""), "damaged", "cannot read the sweep index"),
    "index another kind": Case(_sweep(_index_of(kind="other")), "damaged", "not a sweep index"),
    "index from a newer rig": Case(_sweep(_index_of(format_version=99)), "damaged", "newer ncp-local"),
    "index point without a job": Case(_sweep(_index_of(points=[{"status": "done"}])), "damaged", "points.0.job"),
    "index shard dir misnamed": Case(
        _sweep(rows=[PointRow(job=0, run_dir="/nonexistent", shard_dir="/x/shard-x-of-y", status="pending")]),
        "queued",
        "",
    ),
    "index run dir gone": Case(
        _sweep(rows=[PointRow(job=0, run_dir="/nonexistent/run", status="done")]), "damaged", "not found"
    ),
    "index of 10,000 points": Case(
        _sweep(rows=[PointRow(job=i, overrides=(f"seed={i}",)) for i in range(10_000)]), "queued", "", row=9_999
    ),
    "index beside a huge file": Case(
        _with_file(_sweep(_index_of()), "index-2.json", b" " * 65_000_001), "damaged", "larger than 64 MB"
    ),  # fmt: skip
    # -- results, checkpoints and the manifest --
    "results nested 200k deep": Case(_deep_result, "stopped", ""),
    "odd checkpoints": Case(_odd_checkpoints, "stopped", ""),
    "turn logs garbled, 200k deep, empty": Case(_turn_logs, "stopped", "not running"),
    "manifest trials a word": Case(
        _manifest({"dataset": {"specs": [1]}, "config": {"trials": {"count": "x"}}}), "queued", ""
    ),  # fmt: skip
    "manifest shard index past its count": Case(
        _manifest({"dataset": {"specs": [1, 2]}, "config": {"shard": {"count": 2, "index": 9}}}), "queued", ""
    ),
    # -- a glob over a damaged folder, a good one and one that is no run --
    "glob meets a damaged sweep": Case(_glob_with_damage, "running", "", row=0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_damaged_record_gives_a_row_never_a_traceback(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    entry = case.build(tmp_path)
    started = time.monotonic()
    rows = rs.status_rows([str(entry)], T, NOW, slurm=False)
    assert time.monotonic() - started < BOUND_S, "bounded work whatever a record claims"
    row = rows[case.row]
    assert row.state == case.state, (row.state, row.line)
    assert case.says in f"{row.line} {row.next}", row
    # Neither rendering trips over what was read.
    table(rows)
    json.dumps(rs.document(rows, NOW))
    if row.state not in ("running", "done"):
        assert row.next, f"a row that is {row.state} says what to do next"


def test_the_finished_count_is_results_on_disk_not_the_last_heartbeat(tmp_path: Path) -> None:
    d = _run(tmp_path / "run", json.dumps(_beat(episodes_finished=0)), results=2)
    (row,) = rs.rows_for(str(d), T, NOW, slurm=False)
    assert row.episodes_finished == 2


def _fake(bin_: Path, name: str, script: str) -> None:
    bin_.mkdir(exist_ok=True)
    (bin_ / name).write_text("#!/bin/sh\n" + script)
    (bin_ / name).chmod(stat.S_IRWXU)


def test_a_hung_squeue_is_waited_for_once_within_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Thirty re-submissions and a squeue that never answers: one reading waits at most BUDGET_S in all."""
    jobs = [{"job": str(100 + i), "tasks": [i]} for i in range(30)]
    root = tmp_path / "sharded"
    root.mkdir()
    (root / "submit.json").write_text(json.dumps({"identity": "x", "shards": 30, "jobs": jobs}))
    _fake(tmp_path / "bin", "squeue", "sleep 30\n")
    _fake(tmp_path / "bin", "sacct", "sleep 30\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(st, "TIMEOUT_S", 1.0)
    monkeypatch.setattr(st, "BUDGET_S", 2.0)
    started = time.monotonic()
    rows = rs.rows_for(str(root), T, time.time())
    assert time.monotonic() - started < 6.0
    assert len(rows) == 30 and {r.state for r in rows} == {"queued"}


def test_squeue_garbage_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(
        tmp_path / "bin", "squeue", 'printf "101_0|RUNNING||n1\\ngarbage\\n101_x|RUNNING||n\\n|||\\n101_1|PENDING\\n"\n'
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    said = st.from_squeue(["101"])
    assert list(said.tasks) == [("101", 0)] and not said.unknown


BAD_SETTINGS = [
    "status.watch=0",
    "status.watch=-1",
    "status.watch=0.1",
    "status.watch=inf",
    "status.watch=nan",
    "status.watch=often",
    "status.heartbeat_s=-1",
    "status.heartbeat_s=0.01",
    "status.heartbeat_s=inf",
    "status.heartbeat_s=1e9",
    "status.heartbeat_s=fast",
]


@pytest.mark.parametrize("setting", BAD_SETTINGS)
def test_a_bad_status_setting_is_one_line_exit_2(tmp_path: Path, setting: str) -> None:
    d = _run(tmp_path / "run")
    out = run_cli("mode=status", f"runs=[{d}]", setting, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config: status.") and not out.stdout, out.stderr


def test_heartbeat_0_is_off_as_documented(tmp_path: Path) -> None:
    d = _run(tmp_path / "run")
    out = run_cli("mode=status", f"runs=[{d}]", "status.heartbeat_s=0", cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_a_glob_names_a_folder_it_cannot_read_and_reads_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permissions do not stop root (the CI's user): the folder's listing is made to fail instead."""
    _run(tmp_path / "all" / "good", json.dumps(_beat()))
    _run(tmp_path / "all" / "locked")
    real = rs.shard_dirs

    def refuse(root: Path) -> dict:
        if root.name == "locked":
            raise PermissionError(13, "Permission denied")
        return real(root)

    monkeypatch.setattr(rs, "shard_dirs", refuse)
    rows = rs.status_rows([str(tmp_path / "all" / "*")], T, NOW, slurm=False)
    assert [(r.name, r.state) for r in rows] == [("good", "running"), ("locked", "damaged")]
    assert "Permission denied" in (rows[1].line or "")
