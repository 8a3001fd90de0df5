"""The run directory: where a run may write, file modes, seals, a damaged
manifest, a full disk."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from cli_runner import CliResult, run_cli
from helpers import Scripted, make_spec
from ncp_local import config as config_mod
from ncp_local import modes
from ncp_local.errors import InputError
from ncp_local.exits import EXIT_DISK_FULL
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.places import check_place
from ncp_local.rundir.store import RunDir, RunMismatch

ROOT = Path(__file__).resolve().parent.parent
SCRIPTED = ("engine=scripted", "max_turns=3", "progress=false", "engine.conflict_rate=0")


def _run(*args: str, cwd: Path, umask: int | None = None) -> CliResult:
    before = os.umask(umask) if umask is not None else None
    try:
        return run_cli(*args, cwd=cwd)
    finally:
        if before is not None:
            os.umask(before)


def _results(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((d / "results").glob("*.json"))}


def _files(d: Path) -> list[Path]:
    return [p for p in d.rglob("*") if p.is_file()]


# ---- file modes -------------------------------------------------------------------


def test_files_follow_the_umask(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert _run(*SCRIPTED, f"out_dir={run}", cwd=tmp_path, umask=0o022).returncode == 0
    rep = _run("mode=report", f"runs=[{run}]", cwd=tmp_path, umask=0o022)
    assert rep.returncode == 0, rep.stderr
    sharded = tmp_path / "sharded"
    for i in range(2):
        assert (
            _run(
                *SCRIPTED, f"out_dir={sharded}", "shard.count=2", f"shard.index={i}", cwd=tmp_path, umask=0o022
            ).returncode
            == 0
        )
    assert _run(*SCRIPTED, "mode=merge", f"out_dir={sharded}", cwd=tmp_path, umask=0o022).returncode == 0
    files = _files(run) + _files(sharded)
    names = {p.name for p in files}
    assert {"manifest.json", "calls.jsonl", "DONE", "results.md", "index.html"} <= names
    assert any(p.parent.name == "results" and p.parent.parent.name == "merged" for p in files)
    for p in files:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode & 0o044 == 0o044 and not mode & 0o022, f"{p}: {oct(mode)}"
    # The umask decides, not a fixed mode: a private umask keeps them private.
    private = tmp_path / "private"
    assert _run(*SCRIPTED, f"out_dir={private}", cwd=tmp_path, umask=0o077).returncode == 0
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in _files(private))


# ---- where a run may write -----------------------------------------------------------


def test_refused_places(tmp_path: Path) -> None:
    src = tmp_path / "src"
    assert _run(*SCRIPTED, f"out_dir={src}", cwd=tmp_path).returncode == 0
    before = _results(src)
    dataset = tmp_path / "dataset"
    shutil.copytree(ROOT / "specs", dataset)
    cases = [
        (("out_dir=/",), "/: out_dir: the filesystem root is never a run directory"),
        ((f"out_dir={dataset}",), f"{dataset}: out_dir: not empty and not a run directory"),
        ((f"out_dir={src / 'inner'}",), f"inside the run directory {src}"),
        (("mode=reaudit", f"runs=[{src}]", f"out_dir={src / 'results' / 'x'}"), "inside the source run"),
    ]
    for args, message in cases:
        proc = _run(*SCRIPTED, *args, cwd=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    assert _results(src) == before and sorted(p.name for p in src.iterdir()) == [
        ".lock",
        "DONE",
        "calls.jsonl",
        "checkpoints",
        "engine.log",
        "manifest.json",
        "results",
        "status.json",
    ]
    assert sorted(p.name for p in dataset.iterdir()) == ["index.yaml", "sources.yaml", "specs"]
    check_place(tmp_path / "new" / "deeper")  # a new folder is fine
    check_place(src)  # so is the run's own


def test_a_submitted_run_directory_is_a_place_to_run(tmp_path: Path) -> None:
    """What slurm/submit.py writes before any task starts (its record, the tasks' log folder, a served role's
    endpoint file) is the run's own: the first task runs there (it was refused: issue 57)."""
    root = tmp_path / "runs" / "local-abc"
    (root / "slurm").mkdir(parents=True)
    (root / "submit.json").write_text("{}")
    (root / "endpoint-auditor").write_text("http://node:8000/v1")
    check_place(root)
    (root / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not empty and not a run directory"):
        check_place(root)


def test_damaged_manifest_is_set_aside_results_kept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _run(*SCRIPTED, f"out_dir={out}", cwd=tmp_path).returncode == 0
    before = _results(out)
    (out / "manifest.json").write_text('{"identity": "abc", "conf')
    again = _run(*SCRIPTED, f"out_dir={out}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "manifest.json: not JSON" in again.stderr and "nothing left to do" in again.stdout
    assert (out / "quarantine" / "manifest.json").exists() and _results(out) == before
    json.loads((out / "manifest.json").read_text())


def test_seals_catch_edits_and_other_runs(tmp_path: Path) -> None:
    specs = [make_spec("a"), make_spec("b")]
    Scripted(tmp_path / "one", specs, max_turns=2).run()
    path = tmp_path / "one" / "results" / "a.json"
    data = json.loads(path.read_text())
    data["opening"] = "an edited opening"
    path.write_text(json.dumps(data))
    store = RunDir(tmp_path / "one")
    store.open({}, "test", warn=lambda line: None)
    store.close()
    assert len(store.quarantined) == 1 and "does not match its seal" in store.quarantined[0]
    # A result copied in from a run of another identity is not this run's.
    other = tmp_path / "two"
    (other / "results").mkdir(parents=True)
    shutil.copy(tmp_path / "one" / "results" / "b.json", other / "results" / "b.json")
    with pytest.raises(RunMismatch, match="sealed by run 'test'"):
        RunDir(other).open({}, "another")
    with pytest.raises(InputError, match="inside the run directory"):
        RunDir(tmp_path / "one" / "results").open({}, "test")


# ---- a full disk -------------------------------------------------------------------


def _main(*overrides: str) -> int:
    return modes.main(config_mod.compose(list(overrides)))


FULL = ("engine=scripted", "max_turns=4", "progress=false", "engine.conflict_rate=0", "concurrency=2")


@pytest.mark.parametrize("failing,share", [("write", 0.5), ("replace", 0.5)])
def test_disk_full_is_one_line_nothing_corrupted_and_resumes(
    tmp_path: Path, failing: str, share: float, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = {"write": os.write, "replace": os.replace}
    made = {"n": 0}

    def counted(*args: Any) -> Any:
        made["n"] += 1
        return real[failing](*args)

    # The disk fills halfway through the run: after half the writes (or renames) a whole run makes.
    monkeypatch.setattr(os, failing, counted)
    reference = tmp_path / "reference"
    assert _main(*FULL, f"out_dir={reference}") == 0
    monkeypatch.undo()
    after = int(made["n"] * share)
    assert after >= 4, made
    out = tmp_path / "full"
    calls = {"n": 0}

    def full(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > after:
            if failing == "write" and calls["n"] % 2:
                real["write"](args[0], bytes(args[1])[:7])  # part of the line reached the disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real[failing](*args)

    monkeypatch.setattr(os, failing, full)
    capsys.readouterr()
    code = _main(*FULL, f"out_dir={out}")
    monkeypatch.undo()
    err = capsys.readouterr().err.strip()
    assert code == EXIT_DISK_FULL == 4
    assert err.startswith(f"error: {out}: disk full") and "\n" not in err and "re-run the same command" in err
    # Nothing half-written: every file parses, no temp file, every log line whole.
    for p in _files(out):
        assert not p.name.endswith(".tmp"), p
        if p.suffix == ".json":
            json.loads(p.read_text())
    text = (out / "calls.jsonl").read_text()
    assert text.endswith("\n") and len(read_calls(out / "calls.jsonl")) == text.count("\n")
    assert not (out / "DONE").exists()
    assert _main(*FULL, f"out_dir={out}") == 0
    assert _results(out) == _results(reference) and len(_results(out)) == 3


def test_a_runs_results_are_read_from_the_directory_when_asked_not_held(tmp_path: Path) -> None:
    """What a run returns names every episode and reads each result from its file when asked (a run of
    hundreds of 100-turn episodes holds none in memory), checked as any read is."""
    specs = [make_spec("a"), make_spec("b")]
    results = Scripted(tmp_path, specs, max_turns=2).run()
    assert list(results) == ["a", "b"] and len(results) == 2
    first = results["a"]
    assert first.spec_id == "a" and len(first.turns) == 2
    assert results["a"] is not first  # read again, not kept
    with pytest.raises(KeyError):
        results["c"]
    path = tmp_path / "results" / "a.json"
    path.write_text(path.read_text().replace('"max_turns": 2', '"max_turns": 3'))
    with pytest.raises(InputError, match="a.json"):
        results["a"]  # an edited file is refused, as when a run reads it back
