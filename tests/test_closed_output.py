"""A command whose output's reader stops reading (`ncp-local mode=status | head -1`) ends quietly with
EXIT_CLOSED_PIPE (141, as a shell tool killed by SIGPIPE), with no traceback, and every file it had written
stays whole (ncp_local/entry.py, errors.reader_may_close). Real processes, real pipes: the subject is the
process's exit status and its descriptors."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ncp_local.exits import EXIT_CLOSED_PIPE

ROOT = Path(__file__).resolve().parent.parent
F_SETPIPE_SZ = 1031  # Linux's fcntl: a pipe's capacity (the smallest is one page)


def _one_line_then_close(cmd: list[str], cwd: Path, which: str = "stdout") -> tuple[str, int, str]:
    """Runs `cmd` with `which` (stdout or stderr) a one-page pipe, reads its first line, closes the pipe;
    (that line, the exit code, what the other stream said). An output longer than the page blocks the
    writer until the close, so the write that fails is certain, not a race."""
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    other = subprocess.PIPE
    streams = {"stdout": w, "stderr": other} if which == "stdout" else {"stdout": other, "stderr": w}
    proc = subprocess.Popen(cmd, cwd=cwd, text=True, **streams)  # type: ignore[call-overload]
    os.close(w)
    with os.fdopen(r) as reader:
        first = reader.readline()
    said = (proc.stderr if which == "stdout" else proc.stdout).read()
    return first, proc.wait(timeout=120), said


@pytest.mark.parametrize("fmt", ["table", "json"])
@pytest.mark.parametrize("entry", [["run.py"], ["-m", "ncp_local"]], ids=["run.py", "python -m ncp_local"])
def test_a_mode_piped_into_head_ends_quietly_with_141(tmp_path: Path, entry: list[str], fmt: str) -> None:
    # 150 run directories: mode=status prints a row each, far more than the pipe holds, in either format.
    runs = []
    for i in range(150):
        d = tmp_path / f"a-run-directory-whose-name-fills-the-row-{i:03d}"
        (d / "results").mkdir(parents=True)
        runs.append(str(d))
    first, code, stderr = _one_line_then_close(
        [sys.executable, *entry, "mode=status", f"runs=[{','.join(runs)}]", f"status.format={fmt}"], ROOT
    )
    assert first.startswith("run " if fmt == "table" else "{")
    assert code == EXIT_CLOSED_PIPE, stderr[-2000:]
    assert stderr == ""  # no traceback, no "Exception ignored" at the interpreter's exit


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_status_that_fits_the_pipe_is_done_before_head_closes_it(tmp_path: Path, fmt: str) -> None:
    """Written in one piece, a short status is whole in the pipe when `head -1` reads its first line:
    exit 0 in every format, every time (two writes once made it a race: 0 for one format, 141 for the other)."""
    runs = []
    for i in range(3):
        (tmp_path / f"r{i}" / "results").mkdir(parents=True)
        runs.append(str(tmp_path / f"r{i}"))
    for _ in range(3):
        cmd = f"{sys.executable} run.py mode=status 'runs=[{','.join(runs)}]' status.format={fmt}"
        proc = subprocess.run(
            f"{cmd} | head -1; exit ${{PIPESTATUS[0]}}",
            shell=True, cwd=ROOT, capture_output=True, text=True, executable="/bin/bash",
        )  # fmt: skip
        assert proc.returncode == 0 and proc.stderr == "", (proc.returncode, proc.stderr)
        assert proc.stdout.startswith("run " if fmt == "table" else "{") and proc.stdout.count("\n") == 1


def test_a_run_whose_output_is_closed_keeps_what_it_wrote(tmp_path: Path) -> None:
    """The progress lines' reader closes them mid-run: the run stops (141, its heartbeat says why), every
    committed turn and result it wrote stays, and the same command resumes it to the end."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "engine=scripted",
        "engine.delay_s=0.02",
        "limit=3",
        "max_turns=8",
        "progress=true",
        "progress_every_s=0.05",
        "status.heartbeat_s=0.5",
        f"out_dir={out}",
    ]
    first, code, stdout = _one_line_then_close(cmd, tmp_path, which="stderr")
    assert first.startswith("progress: ")
    assert code == EXIT_CLOSED_PIPE and "Traceback" not in stdout, stdout
    beat = json.loads((out / "status.json").read_text())
    assert (beat["state"], beat["exit_code"]) == ("stopped", EXIT_CLOSED_PIPE), beat
    assert not (out / "DONE").exists()
    kept = {p.name: p.read_bytes() for p in (out / "results").glob("*.json")}
    resumed = subprocess.run(cmd[:-4] + ["progress=false", f"out_dir={out}"], cwd=tmp_path, capture_output=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert len(list((out / "results").glob("*.json"))) == 3 and (out / "DONE").exists()
    assert all((out / "results" / name).read_bytes() == data for name, data in kept.items())


def test_the_submitter_ends_the_same_way(tmp_path: Path) -> None:
    """slurm/submit.py (and ncp-local-submit) through the same entry: its reader gone before it writes."""
    r, w = os.pipe()
    os.close(r)  # the reader stopped before the first line (`| head -0`)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "slurm" / "submit.py"), "--dry-run", "--shards", "1", "--", "engine=scripted"],
        stdout=w,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    os.close(w)
    assert proc.returncode == EXIT_CLOSED_PIPE and proc.stderr == "", proc.stderr[-2000:]
