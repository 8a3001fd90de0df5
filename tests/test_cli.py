"""The entry point end to end on the scripted backend (no model)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import CliResult, run_cli

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, cwd: Path) -> CliResult:
    return run_cli(*args, cwd=cwd)


def test_scripted_official_run_and_resume(official_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "official"
    args = (
        "engine=scripted",
        "dataset=ncp_bench",
        f"dataset.path={official_dataset}",
        "max_turns=5",
        f"out_dir={out}",
        "progress=false",
    )
    first = _run(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert len(list((out / "results").glob("*.json"))) == 100
    assert not list((out / "checkpoints").glob("*.jsonl"))
    header = next(line for line in first.stdout.splitlines() if line.startswith("| run |"))
    for col in ("avg turns", "traj %", "sat %", "fact %", "commit %", "player %", "conflict-free"):
        assert col in header
    row = next(line for line in first.stdout.splitlines() if line.startswith(f"| {out.name} |"))
    assert row.split("|")[2].strip() == "100"
    calls_before = (out / "calls.jsonl").read_text().count("\n")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset"]["specs"][:3] == ["movie48", "movie09", "movie72"]
    assert len(manifest["prompts"]["sha256"]) == 64 and manifest["git_revision"]
    assert manifest["config"]["max_turns"] == 5 and "python" in manifest["versions"]

    second = _run(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "nothing left to do" in second.stdout
    assert (out / "calls.jsonl").read_text().count("\n") == calls_before  # no model call made
    assert row in second.stdout  # same table from the stored results


def test_rerun_with_other_config_refuses(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _run("engine=scripted", "max_turns=1", f"out_dir={out}", "progress=false", cwd=tmp_path).returncode == 0
    other = _run("engine=scripted", "max_turns=2", f"out_dir={out}", "progress=false", cwd=tmp_path)
    assert other.returncode == 2 and "another config" in other.stderr


def test_default_out_dir_is_config_hash(tmp_path: Path) -> None:
    a = _run("engine=scripted", "max_turns=1", "progress=false", cwd=tmp_path)
    assert a.returncode == 0, a.stderr
    dirs = list((tmp_path / "runs").iterdir())
    assert len(dirs) == 1 and dirs[0].name.startswith("local-")
    b = _run("engine=scripted", "max_turns=1", "progress=false", "concurrency=3", cwd=tmp_path)
    assert len(list((tmp_path / "runs").iterdir())) == 1 and "nothing left to do" in b.stdout
