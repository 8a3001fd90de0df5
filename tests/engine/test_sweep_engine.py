"""A batched sweep on the real vLLM CPU engine with the embedded model: one engine start serves
every point, and a point's results are byte for byte those of the same config run alone (per-call
seeds, and fp32 on the CPU build is batch-invariant). Small: 2 points (seeds 0 and 1) x 1 spec x 2
turns; the point run alone is the session's `reference_run` (seed 0, tests/engine/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import REFERENCE, REFERENCE_SEED

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=1800)


def _results(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((d / "results").glob("*.json"))}


@pytest.mark.engine
@pytest.mark.timeout(1800)
def test_batched_sweep_one_engine_start_results_equal_alone(reference_run: Path, tmp_path: Path) -> None:
    assert REFERENCE_SEED == "seed=0"  # the sweep's first point is the reference
    swept = _run("-m", "hydra/launcher=batched", "seed=0,1", *REFERENCE, "hydra.sweep.dir=sw", cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr[-3000:]
    index = json.loads((tmp_path / "sw" / "index.json").read_text())
    assert [p["status"] for p in index["points"]] == ["done", "done"]
    (engine,) = index["engines"]  # narrator, player and auditor share the embedded model
    assert engine["engine"] == "vllm" and engine["starts"] == 1 and engine["points"] == [0, 1]
    assert swept.stderr.count("sweep: engine e1 (smollm2-135m-instruct, vllm) started") == 1
    for p in index["points"]:
        manifest = json.loads((Path(p["run_dir"]) / "manifest.json").read_text())
        assert manifest["sweep"]["pid"] == index["pid"] and manifest["sweep"]["engines"]["narrator"]["starts"] == 1
    point = index["points"][0]
    assert "seed=0" in point["overrides"]
    run_dir = Path(point["run_dir"])
    # The same identity (out_dir is not part of it): the seal of every result matches too.
    assert len(_results(run_dir)) == 1
    assert _results(run_dir) == _results(reference_run), \
        "results differ; the calls that did:\n" + _call_diff(run_dir, reference_run)


def _call_diff(a: Path, b: Path) -> str:
    """The calls two runs made differently (stage, attempt, tokens, finish, error), to tell a numeric
    divergence from a failed attempt."""
    def calls(d: Path) -> list[tuple]:
        rows = [json.loads(line) for line in (d / "calls.jsonl").read_text().splitlines() if line.strip()]
        return [(c["spec_id"], c["turn"], c["stage"], c["attempt"], c.get("generated_tokens"),
                 c.get("finish_reason"), (c.get("error") or "")[:160]) for c in rows]
    x, y = calls(a), calls(b)
    return "\n".join(f"sweep {p} | alone {q}" for p, q in zip(x + [None] * len(y), y + [None] * len(x))
                     if p != q and (p or q))
