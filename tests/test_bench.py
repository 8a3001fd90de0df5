"""mode=bench wiring on the scripted backend (the figures themselves come from the real engine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from ncp_local.bench import Way, projection, workload
from ncp_local.spec import load_dataset

ROOT = Path(__file__).resolve().parent.parent


def test_bench_prints_three_ways_and_ratios_last(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "mode=bench", "engine=scripted", "bench.episodes=5",
                           "bench.turns=2"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split("|")[1].strip()[:2] for line in lines if line.startswith("| ") and "way" not in line] == \
        ["a ", "b ", "c "]
    assert re.fullmatch(r"ratios: rig/ceiling=[\d.]+ rig/sequential=[\d.]+ cache_hit=[\d.]+", lines[-1])
    assert any(line.startswith("projection: paper grid") for line in lines)


def test_workload_repeats_specs_with_own_ids() -> None:
    specs = load_dataset(ROOT / "specs").specs
    ids = [s.id for s in workload(specs, 7)]
    assert len(set(ids)) == 7 and ids[3] == f"{specs[0].id}~1"


def test_projection_uses_episodes_alive_per_turn() -> None:
    way = Way("a", wall_s=10, prompt_tokens=1000, generated_tokens=100, turns=10,
              prompt_by_turn={0: 1000.0, 1: 1100.0, 2: 1200.0})
    text = " ".join(projection(way, throughput=1000.0))
    assert "1000 + 100 x turn" in text
