"""scripts/gpu_acceptance.sh, the GPU node's first check: every step, its table and logs, end to end.

On the scripted engine (`--engine scripted`): what is tested here is the
script (steps, verdicts, table, logs, exit status); each step's command on
the real engine is covered by the engine tests (runs, reproducibility across
processes in tests/engine/test_sweep_engine.py, bench). On the embedded model
it is `scripts/gpu_acceptance.sh --cpu` (about 11 minutes on 2 idle cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_acceptance_script_runs_every_step(tmp_path: Path) -> None:
    out = tmp_path / "acc"
    # The script runs the interpreter the tests run on (a git worktree has no .venv of its own).
    env = {**os.environ, "PY": sys.executable}
    proc = subprocess.run(
        [str(ROOT / "scripts" / "gpu_acceptance.sh"), "--cpu", "--engine", "scripted", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    table = (out / "summary.md").read_text()
    assert table == proc.stdout  # the table is printed and kept
    rows = {
        tuple(c.strip() for c in line.split("|")[1:4]): line
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| step")
    }
    assert ("plan", "(defaults)", "go") in rows
    assert ("plan", "smollm2", "go") in rows
    assert "1 episodes: " in rows[("run", "smollm2", "ok")]
    assert "1 episodes identical" in rows[("determinism", "smollm2", "ok")]
    assert "ratios: rig/ceiling=" in rows[("bench", "smollm2", "ok")]
    # The memory table beside the plan (no vLLM engine on engine=scripted: nothing measured).
    assert ("memory", "smollm2", "n/a") in rows and (out / "memory.md").is_file()
    # Each step's full output is kept.
    assert {p.name for p in (out / "logs").iterdir()} == {
        "plan.log",
        "plan-smollm2.log",
        "run-smollm2.log",
        "again-smollm2.log",
        "bench-smollm2.log",
    }
    assert (out / "smollm2" / "a" / "results").is_dir() and (out / "smollm2" / "b" / "results").is_dir()
