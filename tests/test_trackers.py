"""`tracker=mlflow` (its SQLite store, MLflow 3's default) and `tracker=wandb` (offline) on scripted runs: what
is logged reads back (MLflow's client, and `mlflow.search_runs()` in a new process with no setting, as a user
would; W&B's offline run files) equal to the report's figures; a resumed run lands in the
same tracker run; a two-point batched sweep is one MLflow parent run / one W&B group; a tracker that cannot
write, or takes too long, is one warning line and the run exits 0 with the same results."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import wandb_files
from cli_runner import CliResult, run_cli
from ncp_local.report.cost import cost_table
from ncp_local.report.runs import load_run
from ncp_local.tracking import state
from ncp_local.tracking.record import COST_FIELDS, NOT_METRICS
from ncp_local.tracking.wandb_tracker import run_files

pytest.importorskip("mlflow", reason="mlflow-skinny is not installed (the `tracking` extra)")
pytest.importorskip("wandb", reason="wandb is not installed (the `tracking` extra)")
from mlflow.tracking import MlflowClient  # noqa: E402

RUN = ("engine=scripted", "max_turns=4", "progress=false")


def run(tmp: Path, *args: str) -> CliResult:
    options = [a for a in args if a == "-m"]  # options before the overrides
    res = run_cli(*options, *RUN, *(a for a in args if a != "-m"), cwd=tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def report_row(tmp: Path, run_dir: Path) -> dict[str, str]:
    """The report's own main-table row (mode=report, as a user runs it)."""
    out = tmp / f"report-{run_dir.name}"
    rep = run_cli("mode=report", f"runs=[{run_dir}]", f"report.out={out}", "report.html=false", cwd=tmp)
    assert rep.returncode == 0, rep.stderr
    with open(out / "results.csv", newline="") as f:
        [row] = list(csv.DictReader(f))
    return row


def report_metrics(tmp: Path, run_dir: Path) -> dict[str, float]:
    # The text columns (label, run directory, what ran) are the run's tags, never metrics.
    return {k: float(v) for k, v in report_row(tmp, run_dir).items() if k not in NOT_METRICS and v != ""}


def survival(tmp: Path, run_dir: Path) -> list[float]:
    with open(tmp / f"report-{run_dir.name}" / "survival.csv", newline="") as f:
        rows = list(csv.reader(f))
    return [float(r[1]) for r in rows[1:]]


def sqlite_uri(store: Path) -> str:
    """The store `tracker.dir=<store>` writes: MLflow's SQLite database in it."""
    return f"sqlite:///{store.resolve() / 'mlflow.db'}"


def mlflow_id(run_dir: Path) -> str:
    doc = (run_dir / state.STATE).read_text()
    import json

    return str(json.loads(doc)["mlflow"]["id"])


# What a user types in a new shell, in the folder the run was started from: no tracking URI, no MLFLOW_*.
SEARCH_RUNS = """
import json, mlflow
runs = mlflow.search_runs(experiment_names=["ncp"])
print(json.dumps({"uri": mlflow.get_tracking_uri(), "runs": runs.to_dict(orient="records")}, default=str))
"""


def test_mlflow_default_store_reads_back_with_search_runs_and_no_setting(tmp_path: Path) -> None:
    res = run(tmp_path, "limit=1", "out_dir=r", "tracker=mlflow")
    uri = sqlite_uri(tmp_path)
    assert f"in {uri} (to open it: mlflow ui --backend-store-uri {uri})" in res.stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    proc = subprocess.run(
        [sys.executable, "-c", SEARCH_RUNS], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["uri"] == uri  # MLflow's own default (sqlite:///mlflow.db) resolved in that folder: the rig's store
    [logged] = found["runs"]
    assert logged["run_id"] == mlflow_id(tmp_path / "r")
    want = report_metrics(tmp_path, tmp_path / "r")
    assert want["episodes"] == 1
    assert {k: logged[f"metrics.{k}"] for k in want} == want
    # The artifacts lie beside the database (mlruns/), not wherever the reader happens to be.
    assert logged["artifact_uri"].startswith((tmp_path.resolve() / "mlruns").as_uri())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db", "mlruns", "r", "report-r"]


def test_mlflow_logs_the_reports_figures_and_a_resume_continues_its_run(tmp_path: Path) -> None:
    store = tmp_path / "mlruns"
    first = run(tmp_path, "limit=1", "out_dir=r", "tracker=mlflow", f"tracker.dir={store}")
    assert "tracker=mlflow: run " in first.stdout and "warning" not in first.stderr
    run_id = mlflow_id(tmp_path / "r")
    client = MlflowClient(tracking_uri=sqlite_uri(store))
    assert client.get_run(run_id).data.metrics["episodes"] == 1
    # The same command over all 3 stories resumes the run directory: the same MLflow run, now of 3.
    run(tmp_path, "out_dir=r", "tracker=mlflow", f"tracker.dir={store}")
    assert mlflow_id(tmp_path / "r") == run_id
    got = client.get_run(run_id)
    [exp] = [e for e in client.search_experiments() if e.name == "ncp"]
    assert [r.info.run_id for r in client.search_runs([exp.experiment_id])] == [run_id]
    want = report_metrics(tmp_path, tmp_path / "r")
    assert want["episodes"] == 3
    assert {k: got.data.metrics[k] for k in want} == want
    assert [m.value for m in sorted(client.get_metric_history(run_id, "survival"), key=lambda m: m.step)][
        -5:
    ] == survival(tmp_path, tmp_path / "r")
    table = cost_table(load_run(tmp_path / "r"))
    for role in {r for r, _ in table.rows}:
        tokens = sum(u.prompt_tokens for (r, _), u in table.rows.items() if r == role)
        assert got.data.metrics[f"cost.{role}.prompt_tokens"] == tokens
    assert got.data.tags["identity"] and got.data.params["max_turns"] == "4"
    # What ran, as in results.csv: a scripted run is tagged as one, every role included.
    assert got.data.tags["engine"] == "scripted" and got.data.tags["auditor_model"] == "scripted"
    assert {a.path for a in client.list_artifacts(run_id)} >= {"survival.json", "cost_by_role.json", "config.json"}
    arts = {a.path for a in client.list_artifacts(run_id, "report")}
    assert {"report/results.csv", "report/survival.png", "report/cost.csv"} <= arts


def test_wandb_offline_logs_the_reports_figures_and_a_resume_continues_its_run(tmp_path: Path) -> None:
    store = tmp_path / "wb"
    run(tmp_path, "limit=1", "out_dir=r", "tracker=wandb", f"tracker.dir={store}")
    run_id = state.read(tmp_path / "r", "wandb", f"{store.resolve()} (offline)")
    assert run_id
    run(tmp_path, "out_dir=r", "tracker=wandb", f"tracker.dir={store}")
    assert state.read(tmp_path / "r", "wandb", f"{store.resolve()} (offline)") == run_id
    files = run_files(store, run_id)
    assert len(files) == 2  # one per logging, the same run id
    assert {r.run_id for r in wandb_files.runs(files)} == {run_id}
    logged = wandb_files.summary(files)
    want = report_metrics(tmp_path, tmp_path / "r")
    assert want["episodes"] == 3 and {k: logged[k] for k in want} == want
    table = cost_table(load_run(tmp_path / "r"))
    for (role, _), _u in table.rows.items():
        for f in COST_FIELDS:
            total = sum(getattr(u, f) for (r, _s), u in table.rows.items() if r == role)
            assert logged[f"cost/{role}/{f}"] == pytest.approx(total)


SWEEP = ("-m", "hydra/launcher=batched", "narrator.temperature=0.2,0.6", "limit=2", "hydra.sweep.dir=sw")


def points(tmp: Path) -> dict[str, Path]:
    from ncp_local.rundir.sweep_index import read_index

    return {" ".join(r.overrides): tmp / str(r.run_dir) for r in read_index(tmp / "sw")}


def test_a_sweep_is_one_mlflow_parent_run(tmp_path: Path) -> None:
    store = tmp_path / "mlruns"
    res = run(tmp_path, *SWEEP, "tracker=mlflow", f"tracker.dir={store}")
    assert "tracker=mlflow: sweep " in res.stdout
    client = MlflowClient(tracking_uri=sqlite_uri(store))
    [exp] = [e for e in client.search_experiments() if e.name == "ncp"]
    runs = client.search_runs([exp.experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("ncp.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 3 and len(children) == 2
    assert state.read(tmp_path / "sw", "mlflow", sqlite_uri(store)) == parent.info.run_id
    for child in children:
        [run_dir] = [d for d in points(tmp_path).values() if mlflow_id(d) == child.info.run_id]
        want = report_metrics(tmp_path, run_dir)
        assert {k: child.data.metrics[k] for k in want} == want
    assert sorted(c.info.run_name for c in children) == ["#0 narrator.temperature=0.2", "#1 narrator.temperature=0.6"]
    # The sweep run again (nothing left to play) joins the same parent and children.
    run(tmp_path, *SWEEP, "tracker=mlflow", f"tracker.dir={store}")
    assert len(client.search_runs([exp.experiment_id])) == 3


def test_a_sweep_is_one_wandb_group(tmp_path: Path) -> None:
    store = tmp_path / "wb"
    run(tmp_path, *SWEEP, "tracker=wandb", f"tracker.dir={store}")
    where = f"{store.resolve()} (offline)"
    group = state.read(tmp_path / "sw", "wandb", where)
    assert group
    for run_dir in points(tmp_path).values():
        run_id = state.read(run_dir, "wandb", where)
        assert run_id is not None
        files = run_files(store, run_id)
        assert {r.run_group for r in wandb_files.runs(files)} == {group}
        want = report_metrics(tmp_path, run_dir)
        logged = wandb_files.summary(files)
        assert {k: logged[k] for k in want} == want


def results(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / "results").glob("*.json"))}


@pytest.mark.parametrize("tracker", ["mlflow", "wandb"])
def test_a_tracker_that_cannot_write_is_one_warning(
    tmp_path: Path, tracker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = run(tmp_path, "limit=2", "out_dir=plain")
    # A store that cannot be written: a read-only folder (or, as root, whom permissions do not stop, a
    # path under a file).
    blocked = tmp_path / "ro"
    blocked.mkdir()
    os.chmod(blocked, 0o555)
    store = blocked / "store" if os.geteuid() != 0 else tmp_path / "afile" / "store"
    (tmp_path / "afile").write_text("")
    # Known at the start, it is refused then, before the run (tests/test_output_paths.py has every key).
    args = (*RUN, "limit=2", "out_dir=tracked", f"tracker={tracker}", f"tracker.dir={store}")
    refused = run_cli(*args, cwd=tmp_path)
    assert refused.returncode == 2 and f"{store}: tracker.dir: " in refused.stderr, refused.stderr
    assert not (tmp_path / "tracked").exists()
    # A store that fails only when the tracker writes (a mount gone read-only during the run: the
    # start's check is skipped here to get there) is one warning, and the run's results stand.
    monkeypatch.setattr("ncp_local.modes._dispatch.check_outputs", lambda keys, raw: [])
    res = run(tmp_path, "limit=2", "out_dir=tracked", f"tracker={tracker}", f"tracker.dir={store}")
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: tracker={tracker}: "), res.stderr
    assert "results are not affected" in warnings[0]
    assert results(tmp_path / "tracked") == results(tmp_path / "plain")
    assert (
        res.stdout.split("calls:")[0].splitlines()[-1].split("|")[2:]
        == plain.stdout.split("calls:")[0].splitlines()[-1].split("|")[2:]
    )
    assert not (tmp_path / "tracked" / state.STATE).exists()


def test_a_slow_tracker_is_given_up(tmp_path: Path) -> None:
    res = run(
        tmp_path, "limit=1", "out_dir=r", "tracker=mlflow", f"tracker.dir={tmp_path / 'm'}", "tracker.timeout_s=0.001"
    )
    [warning] = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert "gave up after tracker.timeout_s=0.001 s" in warning


def test_a_tracker_not_installed_is_refused_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        return None if name == "wandb" else real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    res = run_cli(*RUN, "limit=1", "out_dir=r", "tracker=wandb", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: config: tracker: tracker=wandb needs wandb"), (
        res.stderr
    )
    assert "pip install -e '.[tracking]'" in res.stderr and not (tmp_path / "r").exists()


def test_mlflow_without_its_database_package_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "alembic" else real(name, *a))
    res = run_cli(*RUN, "limit=1", "out_dir=r", "tracker=mlflow", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: config: tracker: tracker=mlflow needs alembic, which is not installed")
    assert not (tmp_path / "r").exists()
    # A tracking server needs no database package here; a database URI does.
    from ncp_local.config import TrackerCfg
    from ncp_local.tracking.mlflow_tracker import needs_database

    assert not needs_database(TrackerCfg(name="mlflow", uri="http://mlflow.lab:5000"))
    assert needs_database(TrackerCfg(name="mlflow", uri="postgresql+psycopg://db/mlflow"))
