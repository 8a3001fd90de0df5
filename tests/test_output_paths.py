"""Every path a mode writes to (issue 57, item 1): one that cannot be made or written is refused in one
line naming its config key and the path, exit 2, before anything is written, and what is already
there (a finished run, a report) is left byte for byte and mtime for mtime as it was.

Two bad places for each output key of each writing mode: one no file can be made in (/proc, a
pseudo-filesystem where even root's mkdir fails) and one under a regular file (the finished run's
own manifest.json, so a slip would land inside the run). Scripted engine, in this process
(tests/cli_runner.py): the whole table runs in seconds.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.exits import EXIT_BAD_INPUT
from ncp_local.modes import MODES
from ncp_local.rundir.places import FILE_KEYS, refused_write

ROOT = Path(__file__).resolve().parent.parent
SPEC_ID = "red_riding_hood"
BASE = ("engine=scripted", "limit=1", "max_turns=1", "progress=false", "dataset.path={ws}/data")
RUN = "runs=[{ws}/run]"

# The two bad places: "{bad}" in a case's arguments becomes one of them.
PLACES = {
    "uncreatable": "/proc/ncp-out",
    "under-a-file": "{ws}/run/manifest.json/ncp-out",
}


@dataclass(frozen=True)
class Case:
    mode: str
    key: str
    args: tuple[str, ...]  # after BASE; "{ws}" the workspace, "{bad}" the bad place
    target: str = "{bad}"  # the value of `key` (a file key names a file in the bad place)


CASES = (
    Case("run", "out_dir", ("out_dir={bad}",)),
    Case("run", "tracker.dir", ("tracker=mlflow", "tracker.dir={bad}", "out_dir={ws}/run-mlflow")),
    Case("run", "tracker.dir", ("tracker=wandb", "tracker.dir={bad}", "out_dir={ws}/run-wandb")),
    Case("rerun", "out_dir", ("mode=rerun", "from={ws}/run", "out_dir={bad}")),
    Case("reaudit", "out_dir", ("mode=reaudit", RUN, "out_dir={bad}")),
    Case("reaudit", "report.out", ("mode=reaudit", "runs=[{ws}/run,{ws}/run]", "report.out={bad}")),
    Case("merge", "out_dir", ("mode=merge", "out_dir={bad}")),
    Case("report", "report.out", ("mode=report", RUN, "report.out={bad}")),
    Case("compare", "report.out", ("mode=compare", "runs=[{ws}/run,{ws}/run]", "report.out={bad}")),
    Case("export", "export.out", ("mode=export", RUN, "export.format=inspect", "export.out={bad}")),
    Case("export", "export.out", ("mode=export", RUN, "export.format=parquet", "export.out={bad}")),
    Case("export", "export.out", ("mode=export", RUN, "export.format=reference", "export.out={bad}")),
    Case("submission", "submission", ("mode=submission", RUN, "submission={bad}/sub.tar.gz"), "{bad}/sub.tar.gz"),
    Case("review", "review.out", ("mode=review", RUN, "review.out={bad}")),
    Case("build", "out", ("mode=build", f"sources={ROOT}/specs/sources.yaml", "out={bad}")),
    Case("bench", "out_dir", ("mode=bench", "bench.episodes=1", "bench.turns=1", "out_dir={bad}")),
    Case("plant", "out_dir", ("mode=plant", RUN, "out_dir={bad}")),
    Case("plant", "report.out", ("mode=plant", RUN, "report.out={bad}")),
)


def _id(case: Case) -> str:
    extra = next((a.split("=", 1)[1] for a in case.args if a.startswith(("tracker=", "export.format="))), "")
    return f"{case.mode}-{case.key}" + (f"-{extra}" if extra else "")


def test_every_output_key_of_every_mode_is_driven() -> None:
    """The table above covers every (mode, key) the modes declare: a key added to a mode without a
    case here fails."""
    declared = {(m.name, key) for m in MODES for key in m.writes}
    assert declared == {(c.mode, c.key) for c in CASES}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-spec dataset, a finished run of it (`run/`) and its report (`report/`)."""
    ws = tmp_path_factory.mktemp("outputs")
    (ws / "data" / "specs").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "specs" / f"{SPEC_ID}.yaml", ws / "data" / "specs")
    (ws / "data" / "index.yaml").write_text(f"specs: [{SPEC_ID}]\n")
    base = [a.format(ws=ws) for a in BASE]
    done = run_cli(*base, f"out_dir={ws}/run")
    assert done.returncode == 0, done.stderr
    made = run_cli(*base, "mode=report", f"runs=[{ws}/run]", f"report.out={ws}/report", "report.html=false")
    assert made.returncode == 0 and (ws / "report" / "results.md").is_file(), made.stderr
    return ws


def state(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """Every file and folder under root: its kind, mtime and (a file's) bytes. Root's own mtime is
    left out: a case's valid keys (e.g. out_dir beside a bad tracker.dir) are checked first, by a
    file made and removed in root."""
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        found[str(path.relative_to(root))] = (
            "dir" if path.is_dir() else "file",
            st.st_mtime_ns,
            path.read_bytes() if path.is_file() else b"",
        )
    return found


@pytest.mark.parametrize("place", PLACES, ids=list(PLACES))
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_unwritable_output_path(case: Case, place: str, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)  # a default (runs/..., ./wandb) would land in the workspace, seen below
    bad = PLACES[place].format(ws=workspace)
    args = [a.format(ws=workspace, bad=bad) for a in (*BASE, *case.args)]
    before = state(workspace)
    result = run_cli(*args)
    target = case.target.format(bad=bad)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == EXIT_BAD_INPUT, (result.returncode, result.stderr)
    line = result.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, line
    assert f"{target}: {case.key}: " in line, line
    assert state(workspace) == before, "the workspace (finished run, report) changed"
    for leftover in workspace.rglob(".ncp-write-check-*"):
        raise AssertionError(f"a write probe left behind: {leftover}")


def test_a_write_refused_after_the_check_names_its_key(tmp_path: Path) -> None:
    """A write the system refuses after the entry's check (a mount gone read-only mid-run) under a
    named output is the same one line, naming the key; elsewhere it is not this error."""
    out, sub = tmp_path / "report", tmp_path / "sub.tar.gz"
    named = [("report.out", out.resolve()), ("submission", sub.resolve())]
    inside = OSError(errno.EROFS, os.strerror(errno.EROFS), str(out / "tables" / "results.md"))
    found = refused_write(inside, named)
    assert found is not None and found.field == "report.out" and str(out) in str(found)
    beside = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / ".sub.tar.gz.ab12.tmp"))
    found = refused_write(beside, named)
    assert found is not None and found.field == "submission" and "submission" in FILE_KEYS
    assert refused_write(OSError(errno.EROFS, "x", str(tmp_path / "elsewhere")), named) is None
    assert refused_write(OSError(errno.ENOSPC, "full", str(out / "a")), named) is None  # disk full: exit 4
