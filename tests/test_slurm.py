"""Sharded runs: the merge (no cluster needed) and a real Slurm array job
(skipped when no Slurm controller answers, e.g. without scripts/start_slurm.sh)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import CliResult, run_cli, run_submit

ROOT = Path(__file__).resolve().parent.parent
SUBMIT = ROOT / "slurm" / "submit.py"
WAIT_S = 600


def _run(*args: str, cwd: Path) -> CliResult:
    return run_cli(*args, cwd=cwd)


def _submit(*args: str, cwd: Path) -> CliResult:
    return run_submit(*args, cwd=cwd)


def _results(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((d / "results").glob("*.json"))}


def _line(out: str, prefix: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(prefix))


# Our own specs (local dataset): six of them, so three shards of two.
LOCAL = ("engine=scripted", "max_turns=3", "progress=false")


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One single-process run and the same config as three shards run by hand."""
    base = tmp_path_factory.mktemp("shards")
    single = _run(*LOCAL, f"out_dir={base / 'single'}", cwd=base)
    assert single.returncode == 0, single.stderr
    for i in range(3):
        shard = _run(*LOCAL, f"out_dir={base / 'sharded'}", "shard.count=3", f"shard.index={i}", cwd=base)
        assert shard.returncode == 0, shard.stderr
    return base / "single", base / "sharded"


def test_merge_equals_single_run(local_runs: tuple[Path, Path], tmp_path: Path) -> None:
    single, sharded = local_runs
    work = tmp_path / "sharded"
    shutil.copytree(sharded, work)
    proc = _run(*LOCAL, "mode=merge", f"out_dir={work}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _results(work / "merged") == _results(single)
    n = len(_results(single))
    assert _line(proc.stdout, f"| {work.name} |").split("|")[2].strip() == str(n)
    manifest = json.loads((work / "merged" / "manifest.json").read_text())
    assert manifest["shards"] == 3 and len(manifest["source"]) == n
    again = _run(*LOCAL, "mode=merge", f"out_dir={work}", cwd=tmp_path)  # repeatable
    assert again.returncode == 0 and _results(work / "merged") == _results(single)


def _broken(local_runs: tuple[Path, Path], tmp_path: Path) -> Path:
    work = tmp_path / "sharded"
    shutil.copytree(local_runs[1], work)
    return work


def _merge_error(work: Path) -> str:
    proc = _run(*LOCAL, "mode=merge", f"out_dir={work}", cwd=work.parent)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("error: merge: ") and "\n" not in err
    assert not (work / "merged").exists()
    return err


def test_merge_refuses_missing_result(local_runs: tuple[Path, Path], tmp_path: Path) -> None:
    work = _broken(local_runs, tmp_path)
    victim = sorted((work / "shard-001-of-003" / "results").glob("*.json"))[0]
    victim.unlink()
    (work / "shard-001-of-003" / "DONE").unlink()
    err = _merge_error(work)
    assert victim.stem in err and "1: unfinished" in err


def test_merge_refuses_duplicated_result(local_runs: tuple[Path, Path], tmp_path: Path) -> None:
    work = _broken(local_runs, tmp_path)
    victim = sorted((work / "shard-000-of-003" / "results").glob("*.json"))[0]
    shutil.copy(victim, work / "shard-002-of-003" / "results" / victim.name)
    assert victim.stem in _merge_error(work) and "duplicated" in _merge_error(work)


def test_merge_refuses_missing_shard(local_runs: tuple[Path, Path], tmp_path: Path) -> None:
    work = _broken(local_runs, tmp_path)
    shutil.rmtree(work / "shard-002-of-003")
    assert "shard(s) 2 of 3" in _merge_error(work)


def test_merge_refuses_mixed_configs(local_runs: tuple[Path, Path], tmp_path: Path) -> None:
    work = _broken(local_runs, tmp_path)
    path = work / "shard-001-of-003" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "identity": "other"}))
    assert "identity" in _merge_error(work)


def test_submit_dry_run_submits_only_unfinished_shards(local_runs: tuple[Path, Path], tmp_path: Path) -> None:
    work = _broken(local_runs, tmp_path)
    args = ("--shards", "3", "--dry-run", "--", *LOCAL, f"out_dir={work}")
    proc = _submit(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "all 3 shards are done" in proc.stdout
    (work / "shard-001-of-003" / "DONE").unlink()
    proc = _submit(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cmd = _line(proc.stdout, "sbatch ")
    assert "--array=1 " in cmd and f"out_dir={work}" in cmd and "shard.count=3" in cmd
    assert f"NCP_PYTHON={sys.executable}" in cmd


def test_submit_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    for args in (
        ("--shards", "3", "--", "auditor=nope"),
        ("--shards", "3", "--", "shard.count=2"),
        ("--shards", "3", "--", "auditor=qwen3", f"models_root={tmp_path}"),
    ):
        proc = _submit(*args, cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0, proc.stderr


# -- a real array job ---------------------------------------------------------------


def _wait_for(job: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        q = subprocess.run(
            ["squeue", "-h", "-r", "-j", job, "-o", "%i %t %r"], capture_output=True, text=True, timeout=60
        )
        if q.returncode == 0 and not q.stdout.strip():
            return
        if q.returncode != 0 and "Invalid job id" in q.stderr:
            return  # already purged from the controller: finished
        time.sleep(3)
    subprocess.run(["scancel", job], timeout=60)
    pytest.fail(f"Slurm job {job} did not finish in {WAIT_S}s: {q.stdout}")


@pytest.mark.timeout(1800)  # the array waits up to WAIT_S in the queue
def test_array_job_equals_single_run(slurm: None, official_dataset: Path, tmp_path: Path) -> None:
    overrides = (
        "dataset=ncp_bench",
        f"dataset.path={official_dataset}",
        "limit=12",
        "engine=scripted",
        "max_turns=4",
        "progress=false",
    )
    # The run directory's name is the config hash: the submitter must name it as run.py does.
    single_cwd = tmp_path / "single"
    single_cwd.mkdir()
    single = _run(*overrides, cwd=single_cwd)
    assert single.returncode == 0, single.stderr
    single_dir = single_cwd / _line(single.stdout, "run directory: ").split(": ", 1)[1]

    array_cwd = tmp_path / "array"
    array_cwd.mkdir()
    sub = _submit("--shards", "3", "--python", sys.executable, "--", *overrides, cwd=array_cwd)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    run_dir = Path(_line(sub.stdout, "run directory: ").split(": ", 1)[1])
    assert run_dir == array_cwd / "runs" / single_dir.name
    job = _line(sub.stdout, "submitted job ").split()[2].rstrip(":")
    _wait_for(job, time.monotonic() + WAIT_S)

    logs = "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted((run_dir / "slurm").glob("*.out")))
    for i in range(3):
        assert (run_dir / f"shard-{i:03d}-of-003" / "DONE").exists(), logs
    assert logs.count(f"python {sys.executable}") == 3 and logs.count("exit 0") == 3, logs

    again = _submit("--shards", "3", "--python", sys.executable, "--", *overrides, cwd=array_cwd)
    assert again.returncode == 0 and "all 3 shards are done" in again.stdout, again.stdout + again.stderr

    merged = _run(*overrides, "mode=merge", f"out_dir={run_dir}", cwd=array_cwd)
    assert merged.returncode == 0, merged.stderr
    assert _line(merged.stdout, f"| {run_dir.name} |").split("|")[2].strip() == "12"
    assert _results(run_dir / "merged") == _results(single_dir)
    assert len(_results(single_dir)) == 12
