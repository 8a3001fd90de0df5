"""Batched sweeps (hydra/launcher=batched, ncp_local/launch/sweep.py) on the scripted engine: one process,
shared engines, each point as it would be alone; failures isolated; the index; labels; grouping by
the memory plan; progress; the auditor table; --help; the sweep bench. No vLLM here (one engine test
is tests/engine/test_sweep_engine.py)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from cli_runner import CliResult, run_cli, run_submit
from ncp_local import config as config_mod
from ncp_local.engines.scripted import ScriptedEngine
from ncp_local.execution import life, placement
from ncp_local.execution import preflight as preflight_mod
from ncp_local.execution.engine_pool import EnginePool
from ncp_local.execution.progress import Progress
from ncp_local.exits import EXIT_BAD_INPUT, EXIT_SWEEP_FAILED
from ncp_local.launch import sweep
from ncp_local.report.labels import by_difference, from_template
from ncp_local.rundir.sweep_index import read_index

ROOT = Path(__file__).resolve().parent.parent
SWEEP = (
    "-m",
    "hydra/launcher=batched",
    "engine=scripted",
    "narrator.temperature=0.2,0.6",
    "seed=0,1",
    "max_turns=2",
    "limit=2",
    "progress=false",
)


def _run(*args: str, cwd: Path) -> CliResult:
    return run_cli(*args, cwd=cwd)


def _results(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((d / "results").glob("*.json"))}


def _main_table(stdout: str) -> list[list[str]]:
    """The cells of the report's main table (the first one it prints; the endings table follows it)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| run |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.split("|")[1:-1]])
    return rows


def _index(d: Path) -> dict[str, Any]:
    return json.loads((d / "index.json").read_text())


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The must-show sweep: 2 temperatures x 2 seeds, batched, in its own working directory."""
    work = tmp_path_factory.mktemp("sweep")
    proc = _run(*SWEEP, "hydra.sweep.dir=sw", cwd=work)
    return work, proc


def test_batched_sweep_one_process_one_engine_start(swept: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    work, proc = swept
    assert proc.returncode == 0, proc.stderr
    index = _index(work / "sw")
    assert [p["status"] for p in index["points"]] == ["done"] * 4
    assert [p["exit_code"] for p in index["points"]] == [0] * 4
    # One engine (the three roles share the model) for all four points, started once.
    assert len(index["engines"]) == 1
    engine = index["engines"][0]
    assert engine["starts"] == 1 and engine["points"] == [0, 1, 2, 3]
    # A scripted engine loads no model: it is labelled `scripted`, never by its config's model name.
    assert engine["model"] == "scripted"
    assert "sweep: engine e1 (scripted, scripted) started" in proc.stderr + proc.stdout
    dirs = [Path(p["run_dir"]) for p in index["points"]]
    assert len(set(dirs)) == 4
    manifests = [json.loads((d / "manifest.json").read_text()) for d in dirs]
    # Every point ran in the sweep's own process, on the same engine.
    assert {m["sweep"]["pid"] for m in manifests} == {index["pid"]}
    assert {m["sweep"]["engines"]["narrator"]["id"] for m in manifests} == {engine["id"]}
    assert all(m["sweep"]["engines"]["auditor"]["starts"] == 1 for m in manifests)
    # The manifest records the point's own command, the one that runs it alone.
    assert manifests[3]["command"]["overrides"] == index["points"][3]["overrides"]
    assert (work / "sw" / "index.md").read_text().count("| done |") == 4


def test_each_point_equals_the_point_run_alone(
    swept: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    work, _ = swept
    index = _index(work / "sw")
    for point in (index["points"][0], index["points"][3]):  # two of four: the others are alike (CI time)
        alone = _run(*point["overrides"], cwd=tmp_path)
        assert alone.returncode == 0, alone.stderr
        run_dir = Path(point["run_dir"])
        here = tmp_path / "runs" / run_dir.name  # same identity, so the same directory name
        assert _results(here) == _results(run_dir) and len(_results(here)) == 2
        again = _run(*point["overrides"], cwd=work)  # in the sweep's directory: nothing left to do
        assert again.returncode == 0 and "nothing left to do" in again.stdout


def test_sweep_again_resumes_every_point_without_engine(swept: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    work, _ = swept
    before = {p["run_dir"]: (Path(p["run_dir"]) / "calls.jsonl").read_bytes() for p in _index(work / "sw")["points"]}
    again = _run(*SWEEP, "hydra.sweep.dir=sw2", cwd=work)
    assert again.returncode == 0, again.stderr
    index = _index(work / "sw2")
    assert index["engines"][0]["starts"] == 0  # all finished: no engine is started
    assert again.stderr.count("nothing left to do") == 4
    assert {p["run_dir"]: (Path(p["run_dir"]) / "calls.jsonl").read_bytes() for p in index["points"]} == before


def test_sweep_report_labels_rows_by_temperature_and_seed(swept: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    work, proc = swept
    # The sweep's own table...
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| #")]
    assert rows == [
        "#0 narrator.temperature=0.2 seed=0",
        "#1 narrator.temperature=0.2 seed=1",
        "#2 narrator.temperature=0.6 seed=0",
        "#3 narrator.temperature=0.6 seed=1",
    ]
    # ...and the report of the sweep folder (and of a glob over the run directories).
    rep = _run("mode=report", "runs=[sw]", "report.resamples=50", "report.html=false", cwd=work)
    assert rep.returncode == 0, rep.stderr
    labels = [r[0] for r in _main_table(rep.stdout)]
    assert labels == [r.split(" ", 1)[1] for r in rows]
    assert (work / "sw" / "report" / "results.md").is_file()  # the report of a sweep folder goes in it
    glob = _run(
        "mode=report",
        "runs=[runs/local-*]",
        "report.resamples=50",
        "report.html=false",
        "report.label='{seed}@{narrator.temperature}'",
        f"report.out={work / 'globrep'}",
        cwd=work,
    )
    assert glob.returncode == 0, glob.stderr
    assert sorted(r[0] for r in _main_table(glob.stdout)) == ["0@0.2", "0@0.6", "1@0.2", "1@0.6"]


def test_one_invalid_point_the_others_run(tmp_path: Path) -> None:
    proc = _run(
        "-m",
        "hydra/launcher=batched",
        "engine=scripted",
        "max_turns=2,-1,1",
        "limit=1",
        "progress=false",
        "hydra.sweep.dir=sw",
        cwd=tmp_path,
    )
    assert proc.returncode == EXIT_SWEEP_FAILED, proc.stderr
    assert "Traceback" not in proc.stderr
    # Refused before anything started, named with its value, and again in the last line.
    first = next(line for line in proc.stderr.splitlines() if "#1 max_turns=-1" in line)
    assert first.startswith("error: sweep point #1 max_turns=-1: config: max_turns:")
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: sweep: 3 point(s): 2 done, 1 failed: #1 max_turns=-1 (exit 2")
    points = _index(tmp_path / "sw")["points"]
    assert [(p["status"], p["exit_code"]) for p in points] == [("done", 0), ("failed", 2), ("done", 0)]
    assert points[1]["run_dir"] is None and "max_turns" in points[1]["error"]
    assert all(len(_results(Path(p["run_dir"]))) == 1 for p in (points[0], points[2]))


def test_unknown_option_in_a_later_point_refuses_the_whole_sweep(tmp_path: Path) -> None:
    """Hydra's own errors refuse the sweep before anything starts, in one line, as under the basic launcher
    (run.py composes every point; the rig's own checks of a batched sweep's points are the launcher's)."""
    proc = _run(
        "-m",
        "hydra/launcher=batched",
        "engine=scripted",
        "auditor=smollm2,nope",
        "max_turns=1",
        "limit=1",
        "progress=false",
        "hydra.sweep.dir=sw",
        "out_dir=runs",
        cwd=tmp_path,
    )
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, proc.stderr
    assert line.startswith("error: auditor: unknown option 'nope'"), line
    assert "(sweep point auditor=nope)" in line and "smollm2" in line, line  # which point, and what there is
    assert not (tmp_path / "runs").exists() and not (tmp_path / "sw" / "index.json").exists()


def _points(*overrides: list[str]) -> list[life.Point]:
    return [life.Point(i, tuple(o), task=config_mod.compose(list(o))) for i, o in enumerate(overrides)]


def _life(points: list[life.Point], sweep_dir: Path) -> life.Life:
    """The points' life as the batched launcher starts it: registered in one pool, grouped by the plan."""
    lf = life.Life(points, life.SweepOf(sweep_dir), say=lambda line: None)
    lf.register()
    return lf


def test_dead_engine_fails_its_point_the_others_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    base = ["engine=scripted", "max_turns=2", "progress=false"]
    # A different engine setting: the second point has an engine of its own, which dies.
    points = _points([*base, "seed=1"], [*base, "seed=2", "engine.die_after_calls=12"])
    code = sweep.run_sweep(points, tmp_path / "sw")
    err = capsys.readouterr().err
    assert code == EXIT_SWEEP_FAILED
    assert (points[0].status, points[0].code) == ("done", 0) and len(points[0].results) == 3
    assert (points[1].status, points[1].code) == ("failed", 3) and "engine died" in points[1].message
    assert "#1 seed=2 engine.die_after_calls=12 (exit 3: engine died" in err.strip().splitlines()[-1]
    # What the dead point committed is checkpointed: the same sweep without the fault resumes it.
    assert list((points[1].out / "checkpoints").glob("*.jsonl")) or list((points[1].out / "results").glob("*.json"))
    again = _points([*base, "seed=1"], [*base, "seed=2"])
    assert sweep.run_sweep(again, tmp_path / "sw2") == 0
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    monkeypatch.chdir(fresh)
    clean = _points([*base, "seed=2"])
    assert sweep.run_sweep(clean, fresh / "sw") == 0
    assert _results(clean[0].out) == _results(again[1].out)  # resumed == uninterrupted


def test_basic_launcher_writes_the_index_too(tmp_path: Path) -> None:
    proc = _run(
        "-m",
        "engine=scripted",
        "seed=0,1",
        "max_turns=1",
        "limit=1",
        "progress=false",
        "hydra.sweep.dir=sw",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    index = _index(tmp_path / "sw")
    assert index["launcher"] == "basic"
    assert [(p["job"], p["status"], p["overrides"][1]) for p in index["points"]] == [
        (0, "done", "seed=0"),
        (1, "done", "seed=1"),
    ]
    assert all(len(_results(Path(p["run_dir"]))) == 1 for p in index["points"])


# ---- grouping by the memory plan -------------------------------------------------------

AUDITORS = ("qwen3", "llama3_1_8b", "gemma3_12b", "mistral_small_24b")


class _FakeStarts:
    """EnginePool.start_model for engine=vllm without vLLM: scripted answers, every start and close counted."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.loaded: set[str] = set()
        self.most_loaded = 0

    def __call__(self, engines: EnginePool, model: Any) -> Any:
        fake = self

        class Engine(ScriptedEngine):
            async def close(self) -> None:
                fake.loaded.discard(model.name + str(model.devices))

        async def start() -> Any:
            name = model.name + str(model.devices)
            self.started.append(name)
            self.loaded.add(name)
            self.most_loaded = max(self.most_loaded, len(self.loaded))
            return Engine()

        return start()


@pytest.mark.engine_libs
def test_points_that_do_not_fit_together_run_in_groups_narrator_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # experiment=auditor_sensitivity on 2 GPUs: the narrator on GPU 0, each auditor set to 0.9 of GPU 1.
    monkeypatch.chdir(tmp_path)
    fake = _FakeStarts()
    monkeypatch.setattr(
        preflight_mod, "check_engines", lambda cfg, roles=(): None
    )  # no weights here; the plan uses built-in facts
    monkeypatch.setattr(EnginePool, "start_model", lambda self, model, key=None: fake(self, model))
    base = [
        "experiment=auditor_sensitivity",
        "plan.gpus=[H100-80GB,H100-80GB]",
        "max_turns=1",
        "limit=1",
        "progress=false",
        "auditor.model.gpu_memory_utilization=0.9",
    ]
    points = _points(*([*base, f"auditor={a}"] for a in AUDITORS))
    for p in points:
        life.prepare(p)
        assert p.status == "waiting", p.message
    assert [[p.num for p in g] for g in _life(points, tmp_path / "sw").groups] == [[0], [1], [2], [3]]
    assert sweep.run_sweep(points, tmp_path / "sw") == 0
    # The shared narrator engine (narrator and player, GPU 0) started once; each auditor once; never more
    # than the narrator and one auditor loaded at a time.
    assert fake.started.count("qwen3-8b[0]") == 1
    assert len(fake.started) == 1 + len(AUDITORS) and fake.most_loaded == 2
    index = _index(tmp_path / "sw")
    assert index["groups"] == [[0], [1], [2], [3]]
    narrator = next(e for e in index["engines"] if "narrator" in e["roles"])
    assert narrator["points"] == [0, 1, 2, 3] and narrator["starts"] == 1


@pytest.mark.engine_libs
def test_planned_shares_put_auditors_that_fit_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Shares left to the plan (the model files' null): the 8B auditors fit GPU 1 together, the 12B and 24B
    # ones need it alone; each group's engines get the plan's shares for that group.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(preflight_mod, "check_engines", lambda cfg, roles=(): None)
    base = ["experiment=auditor_sensitivity", "plan.gpus=[H100-80GB,H100-80GB]", "max_turns=1", "limit=1"]
    points = _points(*([*base, f"auditor={a}"] for a in AUDITORS))
    for p in points:
        life.prepare(p)
        assert p.status == "waiting", p.message
    lf = _life(points, tmp_path / "sw")
    groups, pool = lf.groups, lf.pool
    assert [[p.num for p in g] for g in groups] == [[0, 1], [2], [3]]
    placement.place(groups[0], pool)
    shares = [pool.engines[p.keys["auditor"]].placement["gpu_memory_utilization"] for p in groups[0]]
    assert len(shares) == 2 and sum(shares) <= 0.9 + 1e-9  # both on GPU 1 (devices [1]), within the cap


@pytest.mark.engine_libs
def test_points_that_fit_share_one_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(preflight_mod, "check_engines", lambda cfg, roles=(): None)
    base = ["experiment=auditor_sensitivity", "plan.gpus=[H100-80GB,H100-80GB]", "max_turns=1", "limit=1"]
    share = "auditor.model.gpu_memory_utilization="
    points = _points(
        [*base, "auditor=qwen3", share + "0.45"],
        [*base, "auditor=llama3_1_8b", share + "0.45"],
        [*base, "auditor=mistral_small_24b", share + "0.8"],
    )
    for p in points:
        life.prepare(p)
        assert p.status == "waiting", p.message
    # Two auditors of 0.45 fit GPU 1 together, the third (0.8) does not fit beside them.
    assert [[p.num for p in g] for g in _life(points, tmp_path / "sw").groups] == [[0, 1], [2]]


# ---- labels, progress ------------------------------------------------------------------


def _cfg(**over: Any) -> dict[str, Any]:
    raw = OmegaConf.to_container(
        config_mod.compose(["engine=scripted", *(f"{k}={v}" for k, v in over.items())]), resolve=True
    )
    return raw  # type: ignore[return-value]


def test_labels_by_difference() -> None:
    a, b = _cfg(**{"narrator.temperature": 0.2, "seed": 0}), _cfg(**{"narrator.temperature": 0.6, "seed": 0})
    assert by_difference([a, b]) == ["narrator.temperature=0.2", "narrator.temperature=0.6"]
    # Paths and bookkeeping never label a row.
    c = _cfg(**{"narrator.temperature": 0.2, "concurrency": 3, "out_dir": "x"})
    assert by_difference([a, c]) is None
    # A role whose model differs is named by its model, not by each model setting.
    q = _cfg(**{"auditor": "qwen3"})
    assert by_difference([_cfg(), q]) == ["auditor=smollm2-135m-instruct", "auditor=qwen3-8b"]
    # When folding would make two rows alike, every differing key is shown.
    q2 = _cfg(**{"auditor": "qwen3", "auditor.temperature": 0.1})
    labels = by_difference([q, q2])
    assert labels == ["auditor.temperature=0.6", "auditor.temperature=0.1"]
    assert from_template("T={narrator.temperature} s{seed} {nope}", a) == "T=0.2 s0 ?"


def test_progress_counts_turns_shrinks_total_and_gives_eta(tmp_path: Path) -> None:
    now = [0.0]
    out = io.StringIO()
    p = Progress(every_s=30, stream=out, tty=False, clock=lambda: now[0])
    p.add_run("a", ["s0", "s1"], max_turns=10)
    (tmp_path / "results").mkdir()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "results" / "s2.json").write_text(json.dumps({"turns": [{}, {}, {}]}))
    (tmp_path / "checkpoints" / "s3.json").write_text(json.dumps({"turns": [{}]}))
    p.add_run("b", ["s2", "s3"], max_turns=10, root=tmp_path)  # a finished episode and a resumed one
    assert (p.committed, p.possible) == (4, 33)
    p.start()
    assert out.getvalue().count("\n") == 1  # one line at the start when there is no terminal
    for t in range(1, 5):
        now[0] = 10.0 * t
        p.turn("a", "s0", t)
    assert out.getvalue().count("\n") == 2  # one line every 30 s, not one per event
    p.result("a", "s1", 2)  # s1 ended after 2 turns: its 8 other turns are no longer possible
    assert (p.committed, p.possible) == (4 + 4 + 2, 25)
    # 6 turns in 40 s since the start: the 15 left take at most 100 s.
    assert p.eta_s() == pytest.approx(100.0)
    now[0] = 45.0
    p.call(type("C", (), {"prompt_tokens": 900, "generated_tokens": 90})())  # type: ignore[arg-type]
    line = p.line()
    assert line.startswith("progress: turns 10/25 (40%), episodes 2/4 finished")
    assert "22 tok/s" in line and "ETA <= 1m52s" in line  # 990 tokens in 45 s; 15 turns at 6 per 45 s
    p.point("a", "done")
    assert "points 1/1 done, 0 running" in out.getvalue().splitlines()[-1]


# ---- the auditor table (Table 2) -------------------------------------------------------


def test_reaudit_sweep_prints_the_auditor_table(tmp_path: Path) -> None:
    src = _run(
        "engine=scripted", "engine.conflict_rate=0.4", "max_turns=4", "out_dir=src", "progress=false", cwd=tmp_path
    )
    assert src.returncode == 0, src.stderr
    proc = _run(
        "-m",
        "hydra/launcher=batched",
        "mode=reaudit",
        "runs=[src]",
        "engine=scripted",
        "engine.conflict_rate=0.4,0.9",
        "progress=false",
        "report.resamples=200",
        "hydra.sweep.dir=re",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    table = json.loads((tmp_path / "re" / "auditors" / "auditors.json").read_text())
    assert [a["auditor"].split(" ", 1)[1] for a in table["auditors"]] == [
        "(the run's own)",
        "engine.conflict_rate=0.4",
        "engine.conflict_rate=0.9",
    ]
    assert len(table["pairs"]) == 3 and table["episodes"] == 3
    own = table["pairs"][0]  # the run's own auditor vs the re-audit with its settings
    # The same auditor, seed and rate judge exactly as the run did.
    assert own["kappa"]["point"] == 1.0 and own["pearson"]["point"] == pytest.approx(1.0)
    hot = table["auditors"][2]
    assert hot["conflict"]["point"] >= table["auditors"][0]["conflict"]["point"]
    assert all(
        p["kappa"]["lo"] <= p["kappa"]["point"] <= p["kappa"]["hi"]
        for p in table["pairs"]
        if p["kappa"]["lo"] == p["kappa"]["lo"]
    )
    assert "| auditor A | auditor B |" in proc.stdout
    # The same table from the re-audit directories, without a model: runs=<sweep folder>.
    again = _run("mode=reaudit", "runs=[re]", "report.resamples=200", "report.out=t2", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "t2" / "auditors.json").read_text()) == table


# ---- --help, the sweep bench, slurm -----------------------------------------------------


def test_help_lists_modes_groups_and_model_where_usable(tmp_path: Path) -> None:
    proc = _run("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for mode in ("run", "plan", "lint", "build", "bench", "report", "reaudit", "review", "merge", "rerun"):
        assert f"mode={mode} " in proc.stdout
    assert "auditor=OPTION: deepseek_v3_2, gemma3_12b," in proc.stdout and "hydra/launcher=OPTION" in proc.stdout
    assert "batched" in proc.stdout
    assert "model@<role>.model=OPTION" in proc.stdout and "\n  model=OPTION" not in proc.stdout
    assert "--multirun,-m" in proc.stdout  # Hydra's flags still listed


def test_sweep_bench_compares_batched_and_point_by_point(tmp_path: Path) -> None:
    proc = _run(
        "mode=bench",
        "engine=scripted",
        "bench.sweep={narrator.temperature:[0.2,0.6],seed:[0,1]}",
        "bench.episodes=3",
        "bench.turns=2",
        "engine.delay_s=0.01",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("sweep: batched/sequential=")
    assert "engine starts 1 vs 4" in lines[-1]
    assert "results: identical batched and point by point (12 episodes)" in proc.stdout
    assert "bench: batched way done in" in proc.stderr and "bench: point 4 of 4 done point by point" in proc.stderr
    bad = _run("mode=bench", "engine=scripted", "bench.sweep={narrator.temprature:[0.2]}", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "narrator.temprature" in bad.stderr


def test_slurm_sweep_dry_run_is_one_array_job(tmp_path: Path) -> None:
    proc = run_submit(
        "--shards",
        "2",
        "--dry-run",
        "--",
        "-m",
        "engine=scripted",
        "narrator.temperature=0.2,0.6",
        "max_turns=1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    sbatch = proc.stdout.strip().splitlines()[-1]
    assert sbatch.startswith("sbatch --parsable --array=0-1 ")
    assert " -m hydra/launcher=batched " in sbatch and "narrator.temperature=0.2,0.6" in sbatch
    assert "shard.count=2" in sbatch and "hydra.sweep.dir=" in sbatch
    assert proc.stdout.count(": " + str(tmp_path / "runs")) == 2  # each point's run directory, named up front
    refused = run_submit("--shards", "2", "--dry-run", "--", "-m", "engine=scripted", "max_turns=1,0", cwd=tmp_path)
    assert refused.returncode == 2 and "sweep point engine=scripted max_turns=0: config: max_turns" in refused.stderr
    assert not (tmp_path / "multirun").exists()


def test_sharded_batched_tasks_write_their_own_index(tmp_path: Path) -> None:
    for k in (0, 1):
        proc = _run(
            "-m",
            "hydra/launcher=batched",
            "engine=scripted",
            "seed=0,1",
            "max_turns=1",
            "shard.count=2",
            f"shard.index={k}",
            "progress=false",
            "hydra.sweep.dir=sw",
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (tmp_path / "sw").glob("index*.json"))
    assert names == ["index-shard-000-of-002.json", "index-shard-001-of-002.json"]
    rows = read_index(tmp_path / "sw")
    assert len({r.run_dir for r in rows}) == 2 and all(r.shard_dir for r in rows)
    rep = _run("mode=report", "runs=[sw]", "report.resamples=50", "report.html=false", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert [(r[0], r[1]) for r in _main_table(rep.stdout)] == [("seed=0", "3"), ("seed=1", "3")]
    shutil.rmtree(tmp_path / "runs")
