"""Nothing lost: kills, SIGTERM, a dead engine, a second process, misbehaving models."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cli_runner import CliResult, run_cli
from helpers import Scripted, make_spec, tag
from ncp_local.engines.base import Completion, Request
from ncp_local.rundir.turn_log import SUFFIX, read_log

ROOT = Path(__file__).resolve().parent.parent


def _args(dataset: Path, out: Path, *extra: str) -> list[str]:
    return [
        "engine=scripted",
        "dataset=ncp_bench",
        f"dataset.path={dataset}",
        "limit=20",
        "max_turns=8",
        f"out_dir={out}",
        "progress=false",
        "engine.conflict_rate=0.05",
        *extra,
    ]


def _cmd(dataset: Path, out: Path, *extra: str) -> list[str]:
    """The same run as a process (the tests whose subject is the process: kills, signals, a second process)."""
    return [sys.executable, str(ROOT / "run.py"), *_args(dataset, out, *extra)]


def _results(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))}


def _assert_clean(out: Path, killed: bool = False) -> None:
    """Every file parses; turns numbered 0..n-1 exactly once; no temp file left, except right after a
    SIGKILL, which can land between a temp file's write and its rename (the next open removes it)."""
    for p in list((out / "results").glob("*")) + list((out / "checkpoints").glob("*")):
        if p.name.endswith(".tmp"):
            assert killed and p.name.startswith("."), p
            continue
        if p.suffix == SUFFIX:  # a turn log: every line whole and chained (a kill can cut the last short)
            got = read_log(p, None)
            assert got.checkpoint is not None and (not got.problem or (killed and "cut short" in got.problem)), p
            turns = [t.turn for t in got.checkpoint.turns]
        else:
            turns = [t["turn"] for t in json.loads(p.read_text())["turns"]]
        assert turns == list(range(len(turns)))


def _wait_for(predicate: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(scope="module")
def official_reference(official_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The results of the uninterrupted run, which every interrupted one must end with."""
    reference = tmp_path_factory.mktemp("reference")
    done = run_cli(*_args(official_dataset, reference))
    assert done.returncode == 0, done.stderr
    expected = _results(reference)
    assert len(expected) == 20
    return expected


# 3 kills in `make test`; the 12-kill soak in `make test-all`.
@pytest.mark.parametrize("wanted", [3, pytest.param(12, marks=pytest.mark.slow)])
def test_sigkill_at_random_moments_then_resume_matches(
    official_dataset: Path, official_reference: dict[str, Any], tmp_path: Path, wanted: int
) -> None:
    expected = official_reference
    out = tmp_path / "killed"
    slow = ("engine.delay_s=0.01", "concurrency=4")  # long enough to be killed mid-run
    rng = random.Random(1234)
    kills = 0
    for _ in range(40):
        proc = subprocess.Popen(
            _cmd(official_dataset, out, *slow), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        # Kill once the run is really working, at a random moment after that.
        _wait_for(lambda: (out / "calls.jsonl").exists() and (out / "calls.jsonl").stat().st_size > 0, 120)
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
        _assert_clean(out, killed=True)
        if kills >= wanted or len(_results(out)) == 20:
            break
    assert kills >= wanted - wanted // 5, f"only {kills} kills landed"
    final = run_cli(*_args(official_dataset, out, *slow))
    assert final.returncode == 0, final.stderr
    _assert_clean(out)
    assert _results(out) == expected
    assert not list((out / "checkpoints").glob("*.jsonl"))
    for line in (out / "calls.jsonl").read_text().splitlines():
        json.loads(line)  # no torn line survives a resume
    print(f"survived {kills} SIGKILLs; {len(expected)} results match the uninterrupted run")


def test_sigterm_flushes_and_exit_status_resumes(official_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "term"
    proc = subprocess.Popen(
        _cmd(official_dataset, out, "engine.delay_s=0.01", "concurrency=4"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert _wait_for(lambda: len(list((out / "checkpoints").glob("*.jsonl"))) >= 2, 300)  # a bound, not a speed
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM" in err and "re-run the same command to resume" in err
    _assert_clean(out)
    assert list((out / "checkpoints").glob("*.jsonl"))
    assert not (out / "DONE").exists()
    again = run_cli(*_args(official_dataset, out))
    assert again.returncode == 0, again.stderr
    assert len(_results(out)) == 20 and (out / "DONE").exists()


def test_sigterm_stops_a_sweep_and_its_resume_equals_a_run_alone(
    official_dataset: Path, official_reference: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    # A batched sweep's points live the same life as one run (execution/life.py): SIGTERM stops every
    # point with its turns checkpointed, the index says so, and the same command resumes to the results
    # the run alone gives (point seed=0 is the reference run).
    sweep = tmp_path / "sw"
    point_dir = f"out_dir={tmp_path}/p${{hydra:job.num}}"
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", "hydra/launcher=batched", "seed=0,1", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(
        [*cmd, *_args(official_dataset, tmp_path, "engine.delay_s=0.01", "concurrency=4"), point_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert _wait_for(lambda: len(list(tmp_path.glob("p*/checkpoints/*.jsonl"))) >= 2, 300)  # a bound, not a speed
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "re-run the same command to resume" in err.strip().splitlines()[-1]
    index = json.loads((sweep / "index.json").read_text())
    assert {p["status"] for p in index["points"]} == {"stopped"}, index["points"]
    for p in ("p0", "p1"):
        _assert_clean(tmp_path / p)
        assert not (tmp_path / p / "DONE").exists()
    again = subprocess.run(
        [*cmd, *_args(official_dataset, tmp_path), point_dir], capture_output=True, text=True, cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert _results(tmp_path / "p0") == official_reference
    assert len(_results(tmp_path / "p1")) == 20 and (tmp_path / "p1" / "DONE").exists()


def test_dead_engine_stops_run_then_resume(
    official_dataset: Path, official_reference: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "dead"
    dead = run_cli(*_args(official_dataset, out, "engine.die_after_calls=300"))
    assert dead.returncode == 3
    assert "engine died" in dead.stderr and "re-run the same command to resume" in dead.stderr
    _assert_clean(out)
    resumed = run_cli(*_args(official_dataset, out))
    assert resumed.returncode == 0, resumed.stderr
    assert _results(out) == official_reference


def test_second_process_on_same_run_dir_refused(official_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "locked"
    # Slow enough (minutes of work) that the first is still running however long the second takes to start.
    first = subprocess.Popen(
        _cmd(official_dataset, out, "engine.delay_s=0.5", "concurrency=2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert _wait_for(lambda: (out / "calls.jsonl").exists(), 300)
        second = subprocess.run(_cmd(official_dataset, out), capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert "another process is running in this run directory" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)


MISBEHAVIOUR = {
    "never_valid": lambda req: "I refuse to answer in JSON.",
    "empty": lambda req: "",
    "truncated": lambda req: '{"conflicts": [{"type": "fact", "id"',
    "unknown_id": lambda req: json.dumps({"conflicts": [{"type": "fact", "id": "f_999", "reason": "x"}]}),
    "oversized": lambda req: Completion(
        text='{"conflicts": [{"type": "fact", "reason": "' + "x" * 400, finish_reason="length"
    ),
}


@pytest.mark.parametrize("kind", sorted(MISBEHAVIOUR))
def test_misbehaving_model_ends_only_its_episode(tmp_path: Path, kind: str) -> None:
    specs = [make_spec("good1"), make_spec("bad"), make_spec("good2")]

    def rules(req: Request) -> Any:
        stage, ep, turn, _ = tag(req)
        if ep == "bad" and stage == "conflict_check" and turn == 1:
            return MISBEHAVIOUR[kind](req)
        return None

    run = Scripted(tmp_path, specs, rules, max_turns=3)
    results = run.run()
    assert results["good1"].termination == results["good2"].termination == "max_turns"
    bad = results["bad"]
    assert bad.termination == "invalid" and "conflict_check at turn 2: invalid after 3 attempts" in bad.reason
    attempts = [c for c in run.calls() if c.spec_id == "bad" and c.stage == "conflict_check" and c.turn == 1]
    assert [c.attempt for c in attempts] == [0, 1, 2]
    assert all(c.error for c in attempts)
    assert len({c.error for c in attempts}) == 1  # the same inputs fail the same way, each recorded


def _local(out: Path, *extra: str) -> CliResult:
    """Our own three specs, one episode at a time, no conflicts: predictable lengths."""
    return run_cli(
        "engine=scripted",
        "max_turns=6",
        "concurrency=1",
        "engine.conflict_rate=0",
        f"out_dir={out}",
        "progress=false",
        *extra,
    )


def test_swapped_truncated_and_ghost_files_are_quarantined_and_replayed(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    assert _local(reference).returncode == 0
    expected = _results(reference)

    out = tmp_path / "damaged"
    # The engine dies mid-run: two episodes finished, the third checkpointed.
    died = _local(out, "engine.die_after_calls=100")
    assert died.returncode == 3, died.stderr
    done = sorted((out / "results").glob("*.json"))
    (cp,) = (out / "checkpoints").glob("*.jsonl")
    assert len(done) == 2
    a, b = done
    a_text, b_text = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_text)  # swapped: each file holds the other spec's result
    b.write_bytes(a_text)
    cp.write_bytes(cp.read_bytes()[: len(cp.read_bytes()) // 2])  # truncated
    ghost = out / "results" / "ghost_spec.json"
    ghost.write_bytes(a_text.replace(a.stem.encode(), b"ghost_spec"))  # a spec the dataset lacks

    # mode=report names each failing file and counts none of them.
    report = run_cli("mode=report", f"runs=[{out}]", f"report.out={tmp_path / 'report'}", "report.html=false")
    assert report.returncode == 0, report.stderr
    named = [line for line in report.stdout.splitlines() if "not counted" in line]
    assert len(named) == 3, report.stdout
    assert any(f"{a.name}: holds spec '{b.stem}'" in line for line in named)
    assert any(f"{b.name}: holds spec '{a.stem}'" in line for line in named)
    assert any("ghost_spec.json: no spec 'ghost_spec' in the run's dataset" in line for line in named)
    row = next(line for line in report.stdout.splitlines() if line.startswith("| ") and not line.startswith("| run |"))
    assert row.split("|")[2].strip() == "0"  # episodes counted: none of the failing files

    # The next run quarantines all four (one line each), replays them, and ends as an untouched run.
    resumed = _local(out)
    assert resumed.returncode == 0, resumed.stderr
    warnings = [line for line in resumed.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 4, resumed.stderr
    # The log cut in half: its whole lines stay, the cut one goes aside (all of it, if it was line 1).
    assert any(cp.name in w and "cut short" in w and ("resumes after" in w or "from the start" in w) for w in warnings)
    assert sorted(p.name for p in (out / "quarantine").rglob("*.json*")) == sorted(
        [a.name, b.name, cp.name, ghost.name]
    )
    assert _results(out) == expected
    assert {p.name: p.read_bytes() for p in (out / "results").glob("*.json")} == {
        p.name: p.read_bytes() for p in (reference / "results").glob("*.json")
    }
    again = _local(out)
    assert "warning" not in again.stderr and "nothing left to do" in again.stdout
