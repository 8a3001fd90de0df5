"""Format versions (rundir/formats.py): a run directory written before versions were recorded still
reads, resumes, merges, reports and re-audits; a file of a newer rig's format is refused in one line
naming it (exit 2), and never moved to quarantine/ as damage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.formats import FORMAT_KEY, VERSIONS

ROOT = Path(__file__).resolve().parent.parent
# Written by main on 2026-12-04 (format 1, before versions were recorded): `python run.py engine=scripted
# max_turns=3 out_dir=run shard.index=I shard.count=2` for I = 0, 1, over the rig's own specs/.
OLD = ROOT / "tests" / "data" / "run-format1"
SHARDS = ("shard-000-of-002", "shard-001-of-002")


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(OLD, run)
    return run


def _shard_command(run: Path, index: int) -> tuple[str, ...]:
    return (
        "engine=scripted",
        "max_turns=3",
        f"out_dir={run}",
        f"shard.index={index}",
        "shard.count=2",
        "progress=false",
    )


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*.json"))}


def test_a_format1_run_resumes_merges_reports_and_reaudits(old_run: Path, tmp_path: Path) -> None:
    before = _files(old_run)
    calls_before = [(old_run / s / "calls.jsonl").read_bytes() for s in SHARDS]
    for i in (0, 1):  # the same command again: nothing left to play, nothing changed
        done = run_cli(*_shard_command(old_run, i), cwd=ROOT)
        assert done.returncode == 0, done.stderr
    after = _files(old_run)
    # The manifest records the resume; status.json, bookkeeping, says how this command ended.
    assert {k: v for k, v in after.items() if "manifest" not in k and "status.json" not in k} == {
        k: v for k, v in before.items() if "manifest" not in k
    }
    assert [(old_run / s / "calls.jsonl").read_bytes() for s in SHARDS] == calls_before
    for s in SHARDS:  # every line the older rig wrote reads as a typed call line, none dropped
        assert len(read_calls(old_run / s / "calls.jsonl")) == len(calls_before[SHARDS.index(s)].splitlines())
    manifest = json.loads((old_run / SHARDS[0] / "manifest.json").read_text())
    assert manifest[FORMAT_KEY] == VERSIONS["manifest"] and len(manifest["resumes"]) == 1

    merged = run_cli("mode=merge", f"out_dir={old_run}", cwd=ROOT)
    assert merged.returncode == 0, merged.stderr
    assert len(list((old_run / "merged" / "results").glob("*.json"))) == 3

    report = run_cli(
        "mode=report",
        f"runs=[{old_run}]",
        f"report.out={tmp_path / 'rep'}",
        f"report.dataset={ROOT / 'specs'}",
        cwd=ROOT,
    )
    assert report.returncode == 0, report.stderr
    assert "| 3 |" in (tmp_path / "rep" / "results.md").read_text()

    reaudit = run_cli(
        "mode=reaudit",
        f"runs=[{old_run / 'merged'}]",
        "engine=scripted",
        f"out_dir={tmp_path / 're'}",
        f"report.dataset={ROOT / 'specs'}",
        "progress=false",
        cwd=ROOT,
    )
    assert reaudit.returncode == 0, reaudit.stderr
    assert len(list((tmp_path / "re" / "results").glob("*.json"))) == 3


def _bump(path: Path) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps({FORMAT_KEY: 99, **data}))


@pytest.mark.parametrize("which", ["result", "manifest", "calls"])
def test_a_newer_format_is_refused_in_one_line_and_kept(which: str, old_run: Path, tmp_path: Path) -> None:
    shard = old_run / SHARDS[0]
    if which == "result":
        target = next((shard / "results").glob("*.json"))
        _bump(target)
    elif which == "manifest":
        target = shard / "manifest.json"
        _bump(target)
    else:
        target = shard / "calls.jsonl"
        lines = target.read_text().splitlines()
        target.write_text("\n".join([*lines[:-1], json.dumps({FORMAT_KEY: 99, **json.loads(lines[-1])})]) + "\n")
    kept = target.read_bytes()
    # Reading it (a report), and for a run's own files writing into it (a resume), both refuse.
    commands = [
        ("mode=report", f"runs=[{old_run}]", f"report.out={tmp_path / 'rep'}", f"report.dataset={ROOT / 'specs'}")
    ]
    if which != "calls":
        commands.append(_shard_command(old_run, 0))
    for args in commands:
        done = run_cli(*args, cwd=ROOT)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and str(target) in lines[0] and "format 99" in lines[0], done.stderr
        assert "newer ncp-local" in lines[0]
    assert target.read_bytes() == kept and not (shard / "quarantine").exists()
    assert not (tmp_path / "rep").exists()


# Written by fceb218 (checkpoint format 1: `checkpoints/<episode>.json`, the whole episode rewritten each
# turn) on 2026-12-07: `python run.py engine=scripted max_turns=6 engine.conflict_rate=0 engine.delay_s=0.3
# concurrency=2 out_dir=run` over the rig's own specs/, SIGKILLed with two results written and
# hound_of_the_baskervilles checkpointed after 2 turns.
UNFINISHED = ROOT / "tests" / "data" / "run-format1-unfinished"
SIX = ("engine=scripted", "max_turns=6", "engine.conflict_rate=0", "progress=false")


def test_an_unfinished_format1_run_reports_then_resumes_as_if_never_stopped(tmp_path: Path) -> None:
    """A run killed under checkpoint format 1 reports its episode in flight, resumes from the format-1
    checkpoint into a turn log (format 2), and ends with results byte for byte those of an uninterrupted
    run; the results fceb218 wrote are those this rig writes."""
    run = tmp_path / "run"
    shutil.copytree(UNFINISHED, run)
    old = run / "checkpoints" / "hound_of_the_baskervilles.json"
    assert FORMAT_KEY not in old.read_text() and len(json.loads(old.read_text())["turns"]) == 2
    report = run_cli("mode=report", f"runs=[{run}]", f"report.out={tmp_path / 'rep'}", cwd=ROOT)
    assert report.returncode == 0, report.stderr
    assert "1 of 3 episodes still playing or stopped" in report.stdout, report.stdout
    done = run_cli(*SIX, f"out_dir={run}", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert not list((run / "checkpoints").iterdir()) and not (run / "quarantine").exists()
    reference = tmp_path / "reference"
    assert run_cli(*SIX, f"out_dir={reference}", cwd=ROOT).returncode == 0
    assert _files(run / "results") == _files(reference / "results")
    assert _files(UNFINISHED / "results") == {
        k: v for k, v in _files(reference / "results").items() if k in _files(UNFINISHED / "results")
    }
