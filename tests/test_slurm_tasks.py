"""A contract test of how `mode=status` reads sacct (rundir/slurm.py), from sacct's documented output.

The CI's Slurm keeps no accounting, so its sacct never answers with a line; this holds the parser to what
sacct(1) documents for the call the rig makes (`--noheader --parsable2 --allocations
--format=JobID,State,ExitCode,NodeList`): one line per job allocation, fields split by `|` and none at the
end; an array task's id `<job>_<task>`, tasks still pending as one record `<job>_[<ranges>%<throttle>]`;
`State` one of Slurm's job states, `CANCELLED by <uid>` naming who cancelled; `ExitCode` `<exit>:<signal>`;
`NodeList` `None assigned` before a node is. Every line gives a task a clear state, or is left out with a
note saying why; sacct missing, failing (no accounting storage) or hanging gives no task and the reason,
never a traceback. A fake `sacct` on PATH plays each answer, so the call itself is checked too.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.rundir import slurm as st

# sacct's answer for two array jobs of a submission, one line per allocation, as documented.
ANSWER = """\
101_0|COMPLETED|0:0|gpu01
101_1|FAILED|1:0|gpu02
101_2|CANCELLED by 1000|0:15|gpu03
101_3|TIMEOUT|0:0|gpu04
101_4|PREEMPTED|0:0|gpu05
101_5|NODE_FAIL|0:0|gpu[06-07]
101_6|OUT_OF_MEMORY|0:125|gpu08
101_7|RUNNING|0:0|gpu09
101_[8-9]|PENDING|0:0|None assigned
102_[0,2-3%1]|PENDING|0:0|None assigned
"""
EXPECTED = {
    ("101", 0): ("COMPLETED", 0, "gpu01"),
    ("101", 1): ("FAILED", 1, "gpu02"),
    ("101", 2): ("CANCELLED", 143, "gpu03"),  # SIGTERM: 128 + 15, as a shell says it
    ("101", 3): ("TIMEOUT", None, "gpu04"),  # 0:0: no exit of the task's own; the state says how it ended
    ("101", 4): ("PREEMPTED", None, "gpu05"),
    ("101", 5): ("NODE_FAIL", None, "gpu[06-07]"),
    ("101", 6): ("OUT_OF_MEMORY", 253, "gpu08"),
    ("101", 7): ("RUNNING", None, "gpu09"),
    ("101", 8): ("PENDING", None, None),
    ("101", 9): ("PENDING", None, None),
    ("102", 0): ("PENDING", None, None),
    ("102", 2): ("PENDING", None, None),
    ("102", 3): ("PENDING", None, None),
}


def _seen(said: st.SacctSaid) -> dict[tuple[str, int], tuple[str | None, int | None, str | None]]:
    return {k: (t.state, t.exit_code, t.node) for k, t in said.tasks.items()}


def test_every_documented_state_and_id_form_gives_its_task_a_clear_state() -> None:
    said = st.parse_sacct(ANSWER)
    assert _seen(said) == EXPECTED
    assert said.notes == []
    assert {t.source for t in said.tasks.values()} == {"sacct"}


# Lines that name no array task, or name one in a form sacct does not document: each with the note it gets.
MALFORMED = {
    "no field separator": ("garbage", "1 fields, not 4"),
    "a field missing": ("101_1|FAILED|1:0", "3 fields, not 4"),
    "a field too many (--parsable, with its trailing |)": ("101_1|FAILED|1:0|gpu02|", "5 fields, not 4"),
    "a job step": ("101_1.batch|FAILED|1:0|gpu02", "'101_1.batch' is a job step: ignored"),
    "a job that is no array": ("103|COMPLETED|0:0|gpu01", "'103' is not an array task: ignored"),
    "a task index that is no number": ("101_x|FAILED|1:0|gpu02", "'101_x' is not an array task: ignored"),
    "a range backwards": ("101_[9-8]|PENDING|0:0|None assigned", "'101_[9-8]' is not an array task: ignored"),
    "a range left open": ("101_[8-]|PENDING|0:0|None assigned", "'101_[8-]' is not an array task: ignored"),
}


@pytest.mark.parametrize("line,note", MALFORMED.values(), ids=list(MALFORMED))
def test_a_line_that_names_no_task_is_left_out_with_its_reason(line: str, note: str) -> None:
    said = st.parse_sacct(f"101_0|COMPLETED|0:0|gpu01\n{line}\n\n")
    assert _seen(said) == {("101", 0): ("COMPLETED", 0, "gpu01")}  # the good line still counts
    assert len(said.notes) == 1 and said.notes[0].startswith("sacct line 2: ") and note in said.notes[0], said.notes


def test_fields_it_cannot_read_are_unknown_with_a_note_and_the_state_kept() -> None:
    said = st.parse_sacct("101_1|FAILED|x:y|gpu02\n101_2|LOST_IN_SPACE|2:0|gpu03\n101_3||1:0|\n")
    assert _seen(said) == {
        ("101", 1): ("FAILED", None, "gpu02"),
        ("101", 2): ("LOST_IN_SPACE", 2, "gpu03"),
        ("101", 3): (None, 1, None),
    }
    assert said.notes == [
        "sacct line 1: exit code 'x:y' is not <exit>:<signal>: left unknown",
        "sacct line 2: state 'LOST_IN_SPACE' is not one of Slurm's: kept as given",
    ]


def test_a_requeued_task_is_its_latest_line() -> None:
    said = st.parse_sacct(
        "101_1|PENDING|0:0|None assigned\n101_[0-2]|PENDING|0:0|None assigned\n101_1|RUNNING|0:0|n1\n"
    )
    assert _seen(said)[("101", 1)] == ("RUNNING", None, "n1")


# ---- sacct itself: a fake on PATH ---------------------------------------------------


def _fake(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    script.write_text(f"#!{sys.executable}\nimport sys\n{body}\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def _sacct_answering(folder: Path, answer: str, jobs: str = "101,102") -> Path:
    """A sacct that answers `answer` to the rig's exact call for `jobs`, and refuses any other (as a changed call
    would meet sacct options it does not have, or output it does not parse)."""
    expected = [*st.SACCT[1:], f"--jobs={jobs}"]
    return _fake(
        folder,
        "sacct",
        f"if sys.argv[1:] != {expected!r}:\n"
        "    print('sacct: error: unexpected arguments', sys.argv[1:], file=sys.stderr); sys.exit(1)\n"
        f"sys.stdout.write({answer!r})",
    )


def test_the_rigs_call_gets_the_documented_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{_sacct_answering(tmp_path / 'bin', ANSWER)}{os.pathsep}{os.environ['PATH']}")
    said = st.from_sacct(["101", "102"])
    assert _seen(said) == EXPECTED and said.notes == []


SILENT = {
    "accounting storage disabled": (
        "print('Slurm accounting storage is disabled', file=sys.stderr); sys.exit(1)",
        "sacct: exit 1: Slurm accounting storage is disabled",
    ),
    "an error on stdout only": ("print('sacct: error: Problem talking to the database'); sys.exit(1)", "exit 1"),
    "killed": ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "sacct: exit -9"),
    "hanging": ("import time; time.sleep(30)", "sacct: no answer within 1 s"),
}


@pytest.mark.parametrize("body,why", SILENT.values(), ids=list(SILENT))
def test_sacct_failing_gives_no_task_and_says_why(
    body: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(st, "TIMEOUT_S", 1.0)
    monkeypatch.setenv("PATH", f"{_fake(tmp_path / 'bin', 'sacct', body)}{os.pathsep}{os.environ['PATH']}")
    said = st.from_sacct(["101"])
    assert said.tasks == {} and len(said.notes) == 1 and why in said.notes[0], said.notes


def test_no_sacct_on_path_gives_no_task_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    said = st.from_sacct(["101"])
    assert said.tasks == {} and said.notes == ["sacct: not on PATH"]


# ---- through mode=status ------------------------------------------------------------


def _submitted(root: Path) -> Path:
    """A sharded run queued as array job 101 (10 tasks), nothing on disk yet, no task log."""
    root.mkdir(parents=True)
    (root / "submit.json").write_text(
        json.dumps({"identity": "x", "shards": 10, "jobs": [{"job": "101", "tasks": list(range(10))}]})
    )
    return root


def test_mode_status_shows_what_sacct_says_of_each_task(tmp_path: Path) -> None:
    # The submission's one job; squeue lists none of its tasks (so sacct's view is the one shown).
    bin_ = _sacct_answering(tmp_path / "bin", ANSWER, jobs="101")
    _fake(bin_, "squeue", "sys.exit(0)")
    run = _submitted(tmp_path / "run")
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}
    out = run_cli("mode=status", f"runs=[{run}]", "status.format=json", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    got = [(r["state"], r["exit_code"], r["slurm"]["state"], r["slurm"]["source"]) for r in rows]
    assert got == [
        ("stopped", 0, "COMPLETED", "sacct"),  # Slurm's success, but neither DONE nor a heartbeat: re-submit
        ("failed", 1, "FAILED", "sacct"),
        ("failed", 143, "CANCELLED", "sacct"),
        ("failed", None, "TIMEOUT", "sacct"),
        ("failed", None, "PREEMPTED", "sacct"),
        ("failed", None, "NODE_FAIL", "sacct"),
        ("failed", 253, "OUT_OF_MEMORY", "sacct"),
        ("running", None, "RUNNING", "sacct"),
        ("queued", None, "PENDING", "sacct"),
        ("queued", None, "PENDING", "sacct"),
    ], got
    assert rows[3]["line"] == "Slurm: TIMEOUT before its first heartbeat"


def test_mode_status_without_accounting_answers_from_the_files_and_logs_why(tmp_path: Path) -> None:
    bin_ = _fake(
        tmp_path / "bin", "sacct", "print('Slurm accounting storage is disabled', file=sys.stderr); sys.exit(1)"
    )
    _fake(bin_, "squeue", "sys.exit(0)")
    run = _submitted(tmp_path / "run")
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}
    out = run_cli("mode=status", f"runs=[{run}]", "status.format=json", "verbose=true", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert {(r["state"], r["slurm"]["source"]) for r in rows} == {("queued", "files")}
    assert "mode=status: sacct: exit 1: Slurm accounting storage is disabled" in out.stderr, out.stderr
