"""A misspelt key, option or mode gets the same answer through every entry (issue 57, item 2): run.py,
the `ncp-local` console command and slurm/submit.py all say "did you mean ...?" in one line, exit 2,
never Hydra's `+key` advice or pydantic's `Extra inputs are not permitted`.

And each mode's main field given wrong (missing, not there, the wrong kind of folder): one line that names
the field, exit 2, no traceback.

run.py and submit.py run in this process (tests/cli_runner.py); `ncp-local` runs as the console
script a user runs (beside this Python), one process for all its cases' worth of checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import run_cli, run_submit
from ncp_local.config.suggest import argparse_line
from ncp_local.exits import EXIT_BAD_INPUT

ROOT = Path(__file__).resolve().parent.parent
SUBMIT = ("--dry-run", "--shards", "1", "--")

# (the mistake, what the one line says): the same words through every entry.
MISTAKES = {
    "key": (("max_turn=4",), "max_turn: unknown key (did you mean max_turns?)"),
    "plus-key": (("+max_turn=4",), "max_turn: unknown key (did you mean max_turns?)"),
    "plus-plus-key": (
        ("++narrator.temprature=0.1",),
        "narrator.temprature: unknown key (did you mean narrator.temperature?)",
    ),
    "delete-key": (("~max_turn",), "max_turn: unknown key (did you mean max_turns?)"),
    "dotted-key": (("report.outt=x",), "report.outt: unknown key (did you mean report.out?)"),
    "group-option": (("auditor=qwen4",), "auditor: unknown option 'qwen4' (did you mean qwen3?)"),
    "mode": (("mode=reprot",), "mode: unknown mode 'reprot' (did you mean report?)"),
}


def _one_line(code: int, stdout: str, stderr: str, said: str) -> str:
    assert "Traceback" not in stdout + stderr, stderr
    assert code == EXIT_BAD_INPUT, (code, stderr)
    line = stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, stderr
    assert said in line, (said, line)
    assert "To append to your config" not in line and "Extra inputs" not in line, line
    return line


@pytest.mark.parametrize("entry", ["run.py", "submit.py"])
@pytest.mark.parametrize("mistake", MISTAKES, ids=list(MISTAKES))
def test_a_misspelt_key_option_or_mode(entry: str, mistake: str) -> None:
    args, said = MISTAKES[mistake]
    if entry == "run.py":
        result = run_cli("engine=scripted", *args)
    else:
        result = run_submit(*SUBMIT, "engine=scripted", *args)
    _one_line(result.returncode, result.stdout, result.stderr, said)


@pytest.mark.parametrize(
    ("entry", "args", "said"),
    [
        ("run.py", ("--mutlirun", "engine=scripted"), "unrecognized arguments: --mutlirun (did you mean --multirun?)"),
        ("submit.py", ("--dry-run", "--shardz", "2", "--", "engine=scripted"), "--shardz 2 (did you mean --shards?)"),
        ("submit.py", ("--dry-runn", "--shards", "1", "--", "engine=scripted"), "(did you mean --dry-run?)"),
        # An abbreviation is a misspelling too: argparse would take `--shard` for `--shards` without a word.
        ("submit.py", ("--dry-run", "--shard", "2", "--", "engine=scripted"), "--shard 2 (did you mean --shards?)"),
        ("submit.py", ("--dry-run", "--shards", "1", "--", "--mutlirun"), "--mutlirun (did you mean --multirun?)"),
        (
            "submit.py",
            ("--dry-run", "--shards", "1", "--serve", "auditr", "--", "engine=scripted"),
            "invalid choice: 'auditr'",
        ),
    ],
    ids=["run-option", "submit-option", "submit-flag", "submit-abbreviation", "submit-sweep-flag", "submit-choice"],
)
def test_a_misspelt_option(entry: str, args: tuple[str, ...], said: str) -> None:
    result = run_cli(*args) if entry == "run.py" else run_submit(*args)
    line = _one_line(result.returncode, result.stdout, result.stderr, said)
    if "choice" in said:
        assert "(did you mean auditor?)" in line


def test_the_submitter_still_says_shards_is_required() -> None:
    """--shards is checked after the options are read (so a misspelling is named first), but still required."""
    result = run_submit("--dry-run", "--", "engine=scripted")
    _one_line(result.returncode, result.stdout, result.stderr, "the following arguments are required: --shards")


def test_argparse_line_leaves_other_messages_and_far_words_alone() -> None:
    assert argparse_line("unrecognized arguments: --zzzzzz", ["--shards"]) == "unrecognized arguments: --zzzzzz"
    assert argparse_line("expected one argument", ["--shards"]) == "expected one argument"


def test_the_ncp_local_command_answers_as_run_py() -> None:
    """The console script a user runs (installed beside this Python): each mistake's line, in one process
    per mistake, the same as run.py's in this process."""
    command = Path(sys.executable).parent / "ncp-local"
    if not command.is_file():
        pytest.skip(f"no ncp-local console script beside {sys.executable} (install the package)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for mistake in ("key", "plus-key", "mode"):
        args, said = MISTAKES[mistake]
        proc = subprocess.run(
            [sys.executable, str(command), "engine=scripted", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=300,
        )
        line = _one_line(proc.returncode, proc.stdout, proc.stderr, said)
        assert line == run_cli("engine=scripted", *args).stderr.strip()


# Each mode's main field given wrong, as a user following the README and docs/reference would: missing,
# a path that is not there, a folder of the wrong kind. `{tmp}`: a folder with `empty/` (no run) and
# `junk.tar.gz` (not an archive). The words the one line must hold name the field.
MAIN_FIELDS = {
    "status-none": (("mode=status",), "config: runs: give the run directories"),
    "status-missing": (("mode=status", "runs=[/nonexistent]"), "/nonexistent: runs: no such directory"),
    "report-none": (("mode=report", "runs=[]"), "config: runs: give at least one run directory"),
    "report-not-a-run": (("mode=report", "runs=[{tmp}/empty]"), "empty: runs: not a run directory"),
    "compare-none": (("mode=compare",), "config: runs: give two runs or more"),
    "compare-missing": (("mode=compare", "runs=[/nonexistent,/nonexistent2]"), "/nonexistent: runs: no such run"),
    "export-none": (("mode=export",), "config: runs: give at least one run directory"),
    "export-missing": (("mode=export", "runs=[/nonexistent]"), "/nonexistent: runs: no such run directory"),
    "merge-none": (("mode=merge",), "out_dir: no such directory: give the sharded run's"),
    "merge-missing": (("mode=merge", "out_dir=/nonexistent"), "/nonexistent: out_dir: no such directory"),
    "merge-not-sharded": (("mode=merge", "out_dir={tmp}/empty"), "empty: no shard-iii-of-nnn directories"),
    "review-none": (("mode=review",), "config: runs: give at least one run directory"),
    "review-missing": (("mode=review", "runs=[/nonexistent]"), "/nonexistent: runs: no such run directory"),
    "rerun-none": (("mode=rerun",), "config: from: give the finished run to repeat: from=DIR"),
    "rerun-missing": (("mode=rerun", "from=/nonexistent"), "/nonexistent: from: no such run directory"),
    "rerun-not-a-run": (("mode=rerun", "from={tmp}/empty"), "empty: from: no manifest.json here"),
    "rerun-into-itself": (("mode=rerun", "from={tmp}/empty", "out_dir={tmp}/empty"), "empty: out_dir: is the run to"),
    "reaudit-none": (("mode=reaudit",), "config: runs: reaudit takes one run directory"),
    "reaudit-missing": (("mode=reaudit", "runs=[/nonexistent]"), "/nonexistent: runs: no such run directory"),
    "submission-none": (("mode=submission",), "config: runs: give at least one run directory"),
    "validate-none": (("mode=validate",), "config: submission: give the archive to check"),
    "validate-missing": (("mode=validate", "submission=/nonexistent.tar.gz"), "submission: no such file"),
    "validate-not-an-archive": (("mode=validate", "submission={tmp}/junk.tar.gz"), "submission: not a readable"),
    "lint-missing": (("mode=lint", "dataset.path=/nonexistent"), "/nonexistent: dataset.path: not a directory"),
    "build-none": (("mode=build",), "config: sources: mode=build needs sources=FILE.yaml"),
    "build-missing": (("mode=build", "sources=/nonexistent.yaml", "out={tmp}/b"), "nonexistent.yaml: sources: no such"),
    "build-a-folder": (("mode=build", "sources={tmp}/empty", "out={tmp}/b"), "empty: sources: not a file"),
    "run-missing": (("mode=run", "dataset.path=/nonexistent"), "/nonexistent: dataset.path: not a directory"),
}


@pytest.mark.parametrize("case", MAIN_FIELDS, ids=list(MAIN_FIELDS))
def test_a_modes_main_field_given_wrong(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One line naming the field, exit 2, no traceback, nothing written, in every mode."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.tar.gz").write_text("not an archive")
    monkeypatch.chdir(tmp_path)  # a default out_dir (runs/...) would land here
    before = sorted(p.name for p in tmp_path.rglob("*"))
    args, said = MAIN_FIELDS[case]
    result = run_cli("engine=scripted", *(a.replace("{tmp}", str(tmp_path)) for a in args))
    _one_line(result.returncode, result.stdout, result.stderr, said)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
