"""mode=bench wiring on the scripted backend (the figures themselves come from the real engine)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from ncp_local.bench.cache_sim import unbounded_cache_hit
from ncp_local.bench.entry import NO_MODEL_NOTE
from ncp_local.bench.figures import BenchFigures
from ncp_local.bench.scaling import Scaling, late_hit, projection
from ncp_local.bench.ways import Way, cycled, run_overrides
from ncp_local.engines.base import Message, Request

ROOT = Path(__file__).resolve().parent.parent


def test_bench_prints_three_ways_and_ratios_last(tmp_path: Path) -> None:
    proc = run_cli("mode=bench", "engine=scripted", "bench.episodes=5", "bench.turns=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split("|")[1].strip()[:2] for line in lines if line.startswith("| ") and "way" not in line] == [
        "a ",
        "b ",
        "c ",
        "d ",
    ]
    assert re.fullmatch(
        r"ratios: rig/ceiling=[\d.]+ rig/sequential=[\d.]+ cache_hit=nan rig/replay_k=[\d.]+", lines[-1]
    )
    assert any(line.startswith("projection: paper grid") for line in lines)
    assert any(line.startswith("engine alone, 1 vs 5 sequences: prefill") for line in lines)
    assert any(line.startswith("best rig/sequential batching allows") for line in lines)
    # The sequential way on a sample (config default 3), and the row says so.
    assert "3 of 5 episodes" in next(line for line in lines if line.startswith("| b "))
    # An hour-long bench says where it is, on stderr (stdout stays the results).
    assert [line.split(" done")[0] for line in proc.stderr.splitlines() if line.startswith("bench: (")] == [
        "bench: (a)",
        "bench: (b)",
        "bench: (c)",
        "bench: (d)",
    ]
    assert not any("done in" in line for line in lines)
    # No model ran: one line says the figures measure the rig only (the figures stay on stdout, unchanged).
    assert [line for line in proc.stderr.splitlines() if "measure the rig only" in line] == [NO_MODEL_NOTE]
    # The figures as a record in the bench's run directory (runs/bench-<time> without out_dir).
    [folder] = (tmp_path / "runs").iterdir()
    fig = BenchFigures.read(folder / "bench.json")
    assert [w.key for w in fig.ways] == ["a", "b", "c", "d"] and "\n".join(fig.lines) == "\n".join(lines[1:])
    assert fig.workload.episodes == 5 and fig.workload.turns == 2 and fig.workload.engine == "scripted"
    # No model loaded: the bench names what played (`scripted`), not the model the config leaves in place.
    assert fig.workload.model == "scripted" and "turns on scripted (scripted)" in lines[0]
    assert "smollm2" not in proc.stdout
    assert fig.machine.cores and fig.commit and fig.date
    # The rig's way plays without the speculative player: the replay keeps one call per episode in flight.
    assert json.loads((folder / "a-rig" / "manifest.json").read_text())["config"]["speculative_player"] is False
    assert set(fig.ratios) == {"rig/ceiling", "rig/sequential", "cache_hit", "rig/replay_k"}
    a, c, d = fig.way("a"), fig.way("c"), fig.way("d")
    assert a and c and d and a.calls == c.calls == d.calls and a.prompt_tokens == d.prompt_tokens
    shown = {k: float("nan") if v is None else v for k, v in fig.ratios.items()}  # a ratio not measured: None
    assert fig.ratios["cache_hit"] is None
    assert lines[-1] == "ratios: " + " ".join(f"{k}={v:.2f}" for k, v in shown.items())
    # The same out_dir again measures again: no way resumes the finished run directories of the first.
    again = run_cli(
        "mode=bench", "engine=scripted", "bench.episodes=5", "bench.turns=2", f"out_dir={folder}", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    second = BenchFigures.read(folder / "bench.json")
    assert [(w.key, w.calls) for w in second.ways] == [(w.key, w.calls) for w in fig.ways]


def test_a_bench_stopped_by_sigterm_says_so_in_one_line_with_the_signals_exit_code(tmp_path: Path) -> None:
    """SIGTERM while way (a) plays (its life holds the signals, then hands them back): exit 143, one line."""
    out = tmp_path / "bench"
    cmd = [sys.executable, str(ROOT / "run.py"), "mode=bench", "engine=scripted", "engine.delay_s=0.05"]
    cmd += ["bench.episodes=4", "bench.turns=40", "bench.sequential=false", f"out_dir={out}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 300  # a bound, not a speed
    while not list((out / "a-rig" / "checkpoints").glob("*.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err, err
    assert [line for line in err.splitlines() if "stopped by" in line] == [
        "bench: stopped by SIGTERM; nothing measured (a bench does not resume: run it again)"
    ]
    assert not (out / "bench.json").exists()


def test_replay_k_keeps_one_call_per_episode_in_flight_in_the_rigs_order() -> None:
    from ncp_local.bench.ways import run_replay_k
    from ncp_local.engines.base import Completion

    class Probe:
        def __init__(self) -> None:
            self.in_flight: dict[str, int] = {}
            self.most = 0
            self.order: list[tuple[str, int]] = []

        async def generate(self, request: Request) -> Completion:
            ep = request.tags["episode"]
            self.in_flight[ep] = self.in_flight.get(ep, 0) + 1
            assert self.in_flight[ep] == 1
            self.most = max(self.most, sum(self.in_flight.values()))
            self.order.append((ep, request.seed))
            await asyncio.sleep(0)
            self.in_flight[ep] -= 1
            return Completion(text="x", finish_reason="stop", prompt_tokens=3, generated_tokens=1)

    reqs = [
        Request(
            messages=(Message("user", "hi"),),
            temperature=1.0,
            top_p=1.0,
            max_tokens=1,
            seed=i,
            tags={"episode": ep, "turn": 0},
        )
        for i, ep in enumerate("ABABBA")
    ]
    probe = Probe()
    way = asyncio.run(run_replay_k(probe, reqs, turns=2))  # type: ignore[arg-type]
    assert way.calls == 6 and way.prompt_tokens == 18 and probe.most == 2
    assert [s for e, s in probe.order if e == "A"] == [0, 2, 5] and [s for e, s in probe.order if e == "B"] == [1, 3, 4]


def test_the_bench_workload_cycles_the_stories_a_trial_per_round() -> None:
    assert cycled(["a", "b", "c"], 7) == ("a", "b", "c", "a~t1", "b~t1", "c~t1", "a~t2")


def test_a_way_plays_the_bench_commands_run_not_its_bench_settings() -> None:
    given = ["mode=bench", "engine=scripted", "bench.episodes=5", "out_dir=x", "max_turns=9", "seed=3"]
    assert run_overrides(given, ["out_dir=y"]) == [
        "engine=scripted",
        "seed=3",
        "mode=run",
        "progress=false",
        "out_dir=y",
    ]


def test_projection_uses_episodes_alive_per_turn() -> None:
    way = Way(
        "a",
        wall_s=10,
        prompt_tokens=1000,
        generated_tokens=100,
        turns=10,
        prompt_by_turn={0: 1000.0, 1: 1100.0, 2: 1200.0},
    )
    text = " ".join(projection(way, throughput=1000.0))
    assert "1000 + 100 x turn" in text


def _req(text: str, turn: int) -> Request:
    return Request(
        messages=(Message("user", text),), temperature=1.0, top_p=1.0, max_tokens=1, seed=0, tags={"turn": turn}
    )


def test_unbounded_cache_counts_whole_shared_blocks_only() -> None:
    # One "token" per character, blocks of 4.
    reqs = [
        _req("abcdefghij", 0),  # nothing seen yet
        _req("abcdefgXYZ", 1),  # first block shared; the second differs at its 4th token
        _req("abcdefghij", 2),  # both full blocks seen (the last, partial block never counts)
        _req("abcdefgh", 2),  # whole prompt cached: the last token is still computed -> 1 block
        _req("zbcdefghij", 3),
    ]  # shares everything but the first token: no hit (prefix, not substring)
    by_turn = unbounded_cache_hit(reqs, lambda msgs: list(msgs[0].content), block=4)
    assert by_turn == {0: (10, 0), 1: (10, 4), 2: (18, 8 + 4), 3: (10, 0)}
    assert late_hit(by_turn) == 12 / 28
    assert math.isnan(late_hit({0: (10, 5), 1: (10, 5)}))  # no turn from 2 on: no figure, not 0.00


def test_best_speedup_is_amdahl_over_prefill_and_decode() -> None:
    s = Scaling(k=16, prefill_1=1000, prefill_k=1000, decode_1=10, decode_k=100)
    assert s.best_speedup(uncached_prompt=0, generated=100) == 10  # decode only: the decode gain
    assert s.best_speedup(uncached_prompt=1000, generated=0) == 1  # prefill only: no gain here
    assert abs(s.best_speedup(uncached_prompt=9000, generated=10) - (9 + 1) / (9 + 0.1)) < 1e-9


class LruPrefixCache:
    """A fake engine with vLLM's prefix cache in miniature: blocks of a chained hash, least recently
    used evicted first, `kv_tokens` of room; answers are the scripted engine's."""

    block_size = 16

    def __init__(self, kv_tokens: int) -> None:
        from collections import OrderedDict

        from ncp_local.engines.scripted import ScriptedEngine

        self.kv_tokens = kv_tokens
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.answers = ScriptedEngine()

    def tokenize(self, messages: Any) -> list[str]:
        text = "".join(m.content for m in messages)
        return [text[i : i + 4] for i in range(0, len(text), 4)]

    async def reset_prefix_cache(self) -> None:
        self.blocks.clear()

    async def generate(self, request: Any) -> Any:
        ids = self.tokenize(request.messages)
        out = await self.answers.generate(request)
        h, hit, hitting = 0, 0, True
        for start in range(0, len(ids) - len(ids) % self.block_size, self.block_size):
            h = hash((h, tuple(ids[start : start + self.block_size])))
            if hitting and h in self.blocks:
                hit += self.block_size
            else:
                hitting = False
            self.blocks[h] = None
            self.blocks.move_to_end(h)
            while len(self.blocks) * self.block_size > self.kv_tokens:
                self.blocks.popitem(last=False)
        return replace(out, prompt_tokens=len(ids), cached_tokens=min(hit, max(0, len(ids) - 1)))

    async def close(self) -> None:
        return None


def test_long_horizon_bench_finds_thrashing_and_admission_avoids_it(tmp_path: Path) -> None:
    """On a fake engine whose cache holds about two episodes' prefixes: many in flight evict each other
    (the hit falls), admission by cache keeps the hit of an unbounded cache. Every step is a scripted
    `mode=run` played by the life, the fake engine reading each replayed call."""
    from ncp_local.bench.long_horizon import long_horizon
    from ncp_local.bench.ways import bench_point
    from ncp_local.execution.engine_pool import EnginePool
    from ncp_local.plan.growth import Sizes

    def point(name: str, max_turns: int, concurrency: int) -> Any:
        return bench_point(tmp_path / name, 6, max_turns, concurrency, ["engine=scripted"])

    sizes = Sizes(150, 50, 20, 1, 12)
    engine = LruPrefixCache(2 * 15_000)
    pool = EnginePool()
    lines = asyncio.run(
        long_horizon(engine, point("state", 6, 6), point, pool, 6, 2, [1, 2, 6], sizes, lambda _: None, grammar=True)
    )
    assert (tmp_path / "way3" / "DONE").is_file()  # the admission's way: a run directory of its own
    rows = {
        line.split("|")[1].strip(): line.split("|") for line in lines if line.startswith("| ") and "way" not in line
    }
    hit = {name: float(cells[4]) for name, cells in rows.items()}
    last = re.fullmatch(
        r"long-horizon: adaptive_hit=([\d.]+) unbounded_hit=([\d.]+) adaptive/best_fixed=([\d.]+)", lines[-1]
    )
    assert last, lines[-1]
    adaptive, unbounded = float(last[1]), float(last[2])
    assert hit["6 in flight"] < unbounded - 0.1  # thrashing: six episodes' prefixes do not fit
    assert adaptive >= unbounded - 0.05 and adaptive == hit["admission by cache"]
    assert int(rows["admission by cache"][7]) < 6  # it held fewer in flight than all six


def test_rig_alone_plays_mode_runs_life_and_prints_by_tenth(tmp_path: Path) -> None:
    proc = run_cli(
        "mode=bench",
        "bench.rig_alone=true",
        "bench.episodes=2",
        "bench.trials=2",
        "bench.turns=10",
        "bench.fsync_delay_s=0.001",
        f"out_dir={tmp_path / 'b'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("bench: rig alone, 4 episodes (2 stories x 2) x 10 turns on the scripted engine")
    assert "realistic texts, fsync delay 1 ms" in lines[0]
    rows = [line for line in lines if re.match(r"\| \d+-\d+ \|", line)]
    assert [r.split("|")[1].strip() for r in rows] == [f"{k + 1}-{k + 1}" for k in range(10)]
    assert re.fullmatch(r"rig_alone: last/first_tenth=[\d.]+ late_calls_s=\d+ stall_ms=\d+ end_s=[\d.]+", lines[-1])
    assert not (tmp_path / "b" / "rig-alone-run").exists()  # played, measured, removed


def test_scripted_text_lengths_and_the_fsync_hook(tmp_path: Path) -> None:
    from ncp_local.engines.scripted import RandomPolicy
    from ncp_local.rundir import atomic

    def ask(policy: RandomPolicy, stage: str) -> str:
        return policy.answer(
            Request(
                messages=(Message("user", "hi"),),
                temperature=1.0,
                top_p=1.0,
                max_tokens=1,
                seed=7,
                tags={"stage": stage, "turn": 3},
            )
        )

    short, long = RandomPolicy(), RandomPolicy(narration_chars=750, player_chars=250)
    assert len(ask(short, "player")) < 100 and 240 <= len(ask(long, "player")) <= 250
    assert ask(long, "player").startswith(ask(short, "player"))  # the same draws, then filler
    calls: list[int] = []
    real = atomic.os.fsync
    atomic.os.fsync = calls.append  # type: ignore[assignment]
    try:
        with atomic.fsync_delay(0.05):
            started = time.perf_counter()
            atomic.atomic_write(tmp_path / "x", "y")
            assert time.perf_counter() - started >= 0.05 and len(calls) == 1
        started = time.perf_counter()
        atomic.atomic_write(tmp_path / "x", "z")
        assert time.perf_counter() - started < 0.05 and len(calls) == 2
    finally:
        atomic.os.fsync = real  # type: ignore[assignment]


def test_the_rig_alone_benchs_end_is_measured_apart_from_the_last_tenth() -> None:
    from ncp_local.bench.rig_alone import Sample, end, lines, tenths

    # 10 s of calls, 100 a tenth, the process busy all along; then 2 s making 50 results, no call.
    by_tenth = [[k + i / 100 for i in range(100)] for k in range(10)]
    ends = sorted(t for times in by_tenth for t in times)
    samples = [Sample(at=i / 4, cpu_s=i / 4, lag_s=0.0, lag_cpu_s=0.0, rss=0) for i in range(49)]
    samples[45] = Sample(at=45 / 4, cpu_s=45 / 4, lag_s=0.3, lag_cpu_s=0.01, rss=0)  # in the end's window
    rows = tenths(ends, by_tenth, samples, 100)
    # Every tenth the middle 90% of its calls: the last's CPU is its calls', not the results'.
    assert rows[-1].calls == 90 and rows[-1].cpu_s == pytest.approx(9.94 - 9.05)
    assert rows[-1].stall_s == 0.0
    last = end(ends, samples, 50, finished=12.0)
    assert last is not None
    assert last.wall_s == pytest.approx(12 - 9.99) and last.cpu_s == pytest.approx(12 - 9.99)
    assert last.cpu_ms == pytest.approx(1000 * (12 - 9.99) / 50) and last.stall_s == 0.3
    assert end(ends, samples, 0, finished=9.5) is None  # the results were on disk before the last call
    out = lines(rows, last, 2, 0, 0, 12.0, 12.0, 1000)
    assert out[-3].startswith("after the last call: 50 results on disk in 2.0 s (40.2 ms of CPU a result)")
    assert out[-1].endswith("end_s=2.0")
