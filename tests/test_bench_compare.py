"""scripts/bench_compare.py: bad input, reading a run's figures, the medians; no timed assertion."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ncp_local.bench.figures import BenchFigures, Machine, WayFigures, Workload
from ncp_local.exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_SIGNAL

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_compare.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_compare", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bc = _module()


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _script(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture
def worktrees(tmp_path: Path) -> Any:
    """After the test, no worktree of the repository under the test's folder (the script's TMPDIR) is
    left, listed or on disk. Only there: other worktrees (a developer's, a parallel test's) come and go."""
    yield _git("worktree", "list", "--porcelain")
    porcelain = _git("worktree", "list", "--porcelain").splitlines()
    listed = [line.removeprefix("worktree ") for line in porcelain if line.startswith("worktree ")]
    assert not [w for w in listed if line_under(w, tmp_path)]
    assert not list(tmp_path.glob("ncp-bench-compare-*/*/.git"))


def line_under(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


def _no_compare_dirs(tmp: Path) -> list[Path]:
    return sorted(Path(tmp).glob("ncp-bench-compare-*"))


def test_unknown_commit_is_one_line_exit_2_and_leaves_nothing(
    tmp_path: Path, worktrees: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    proc = _script("no-such-commit-42", "bench.episodes=2", cwd=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "no-such-commit-42" in proc.stderr
    assert not _no_compare_dirs(tmp_path)


def test_commit_without_mode_bench_is_one_line_exit_2_and_leaves_nothing(
    tmp_path: Path, worktrees: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _git("rev-list", "--max-parents=0", "HEAD").split()[0]
    if bc.has_bench(root):  # pragma: no cover - the first commit predates mode=bench
        pytest.skip("the root commit has a bench")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    proc = _script(root[:9], cwd=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and root[:9] in proc.stderr and "no mode=bench" in proc.stderr
    assert not _no_compare_dirs(tmp_path)


def test_the_scripts_own_overrides_are_refused(tmp_path: Path, worktrees: str) -> None:
    proc = _script("HEAD", "out_dir=x", cwd=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT and "out_dir" in proc.stderr


# An old tree's printed table, verbatim (noqa: E501 below).
OLD_OUTPUT = """bench: 4 episodes x 2 turns on smollm2-135m-instruct (vllm), max_tokens=512, seed=0
| way | wall s | calls | prompt tok/s | cached tok/s | generated tok/s | total tok/s | turns/min | overhead ms/call (median) |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
| a rig (4 concurrent) | 120.5 | 60 | 600 | 300 | 20.0 | 620 | 4.0 | 0.19 |
| b sequential (one call in flight, 1 of 4 episodes) | 90.0 | 15 | 200 | 100 | 8.0 | 208 | 1.3 | 0.20 |
| c ceiling (same requests, one batch) | 110.0 | 60 | 650 | 320 | 22.0 | 672 | 4.4 | - |
engine alone, 1 vs 4 sequences: prefill 800 vs 700 tok/s (x0.88), decode 16.0 vs 50.0 tok/s (x3.12)
ratios: rig/ceiling=0.92 rig/sequential=2.98 cache_hit=0.61
"""  # noqa: E501


def test_parse_printed_reads_an_old_trees_table_and_ratios() -> None:
    run = bc.parse_printed(OLD_OUTPUT)
    assert sorted(run["ways"]) == ["a", "b", "c"]
    assert run["ways"]["a"]["wall_s"] == 120.5 and run["ways"]["c"]["overhead_ms"] is None
    assert run["ratios"] == {"rig/ceiling": 0.92, "rig/sequential": 2.98, "cache_hit": 0.61}
    assert bc.figure(run, ("ratio", "rig/replay_k")) is None and bc.figure(run, ("wall", "d")) is None
    assert len(run["table"]) == 5
    # An old tree's `nan` (a way it did not run) is "not measured", not a number in the medians.
    assert (
        bc.parse_printed(OLD_OUTPUT.replace("rig/sequential=2.98", "rig/sequential=nan"))["ratios"]["rig/sequential"]
        is None
    )
    with pytest.raises(ValueError):
        bc.parse_printed("bench: nothing\n")


def _figures(rig_wall: float, replay_wall: float) -> BenchFigures:
    def way(key: str, wall: float) -> WayFigures:
        return WayFigures(
            key=key,
            name=f"{key} way",
            wall_s=wall,
            calls=10,
            prompt_tokens=1000,
            cached_tokens=500,
            generated_tokens=100,
            prompt_tok_s=1000 / wall,
            cached_tok_s=500 / wall,
            generated_tok_s=100 / wall,
            total_tok_s=1100 / wall,
            turns_per_min=None,
            overhead_ms=0.2 if key == "a" else None,
            in_flight=1.0,
        )

    return BenchFigures(
        commit="abc",
        date="2026-12-03T00:00:00+00:00",
        machine=Machine(cpu_model="cpu", cores=2),
        vllm="0.32.0",
        workload=Workload(
            episodes=4,
            turns=2,
            sequential=False,
            sequential_episodes=None,
            seed=0,
            max_tokens=512,
            engine="vllm",
            model="m",
        ),
        ways=[way("a", rig_wall), way("c", 100.0), way("d", replay_wall)],
        ratios={
            "rig/ceiling": 100.0 / rig_wall,
            "rig/sequential": None,
            "cache_hit": 0.6,
            "rig/replay_k": replay_wall / rig_wall,
        },
        lines=["| a way | ... |"],
    )


def test_json_figures_round_trip_and_medians_pair_runs_in_order(tmp_path: Path) -> None:
    new = []
    for i, (rig, replay) in enumerate(((110.0, 105.0), (130.0, 120.0), (120.0, 118.0))):
        path = _figures(rig, replay).write(tmp_path / f"n{i}")
        new.append(bc.read_json(path))
    assert new[0]["ways"]["a"]["wall_s"] == 110.0 and new[0]["source"] == "bench.json"
    assert new[0]["ratios"]["rig/sequential"] is None
    old = [bc.parse_printed(OLD_OUTPUT.replace("120.5", str(w))) for w in (100.0, 200.0, 120.0)]
    s = bc.summary(old, new)
    rig = s["figures"]["rig wall s"]
    assert rig["new"]["median"] == 120.0 and rig["new"]["min"] == 110.0 and rig["new"]["max"] == 130.0
    assert abs(rig["new"]["spread"] - 20 / 120) < 1e-12
    assert rig["old"]["median"] == 120.0
    # Paired run by run (old 1 with new 1, ...), the median of the ratios: 1.1, 0.65, 1.0.
    assert s["rig_wall_new_over_old"]["pairs"] == pytest.approx([1.1, 0.65, 1.0])
    assert s["rig_wall_new_over_old"]["median"] == pytest.approx(1.0)
    # Not measured by the old tree: no figure, not a zero.
    assert s["figures"]["rig/replay_k"]["old"]["n"] == 0 and s["figures"]["rig/replay_k"]["new"]["n"] == 3
    text = "\n".join(bc.report("old1", "new1", old, new))
    assert "rig wall new/old: median=1.000 over 3 pairs" in text and text.count("run 1 of 3") == 2


def test_compare_on_the_scripted_engine_alternates_and_cleans_up(
    tmp_path: Path, worktrees: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    proc = _script("HEAD", "engine=scripted", "bench.episodes=2", "bench.turns=1", "--repeats", "1", cwd=tmp_path)
    assert proc.returncode == EXIT_OK, proc.stderr
    runs = [line.split("run.py")[0] for line in proc.stderr.splitlines() if line.startswith("bench_compare: ")]
    assert len(runs) == 2 and "ncp-bench-compare-" in runs[0] and str(ROOT) in runs[1]  # old first, then new
    assert "rig wall new/old: median=" in proc.stdout and "| rig/replay_k |" in proc.stdout
    assert not _no_compare_dirs(tmp_path)


def test_ctrl_c_during_a_run_removes_the_worktree(tmp_path: Path, worktrees: str) -> None:
    env = {**__import__("os").environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "HEAD", "engine=scripted", "bench.episodes=2", "bench.turns=1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # SIGINT back to its default: a shell starts background jobs with it ignored, which Python keeps.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # the first bench has started: the worktree exists
        if line.startswith("bench_compare: "):
            break
    assert _no_compare_dirs(tmp_path)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=300)
    assert proc.returncode == EXIT_SIGNAL["SIGINT"]
    assert not _no_compare_dirs(tmp_path)
