"""The package as a user outside a clone gets it (issue 54): the wheel is built, installed into a fresh
virtual environment with its dependencies resolved from the index, and its `ncp-local` command runs
from an empty folder, reading the configs, prompts and specs the wheel carries.

One module-scoped install serves every test here. uv (the `test` extra) builds and installs: with
its cache warm (`make test` has just filled it creating the Python 3.13 environment) the install
takes seconds, where pip takes a minute and a half (docs/development/packaging.md).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.exits import EXIT_BAD_INPUT
from ncp_local.resources import BUNDLED

ROOT = Path(__file__).resolve().parent.parent
# What a wheel is built from (the rest of the clone: tests, docs, slurm scripts, stays out).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "ncp_local", "hydra_plugins", *BUNDLED)
UV_TIMEOUT_S = 600  # a cold cache downloads the dependencies (about 150 MB)


def _uv(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "uv", *args], cwd=cwd, capture_output=True, text=True, timeout=UV_TIMEOUT_S
    )
    assert proc.returncode == 0, f"uv {' '.join(args)}:\n{proc.stderr[-3000:]}"
    return proc


def _user_env() -> dict[str, str]:
    """The environment of a user who installed the wheel: nothing pointing into this clone."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NCP_BENCH_DATASET", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the fresh environment's bin/ folder)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy: building in the clone would leave build/ and *.egg-info there
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    _uv("build", "--wheel", "--quiet", "--out-dir", str(tmp / "dist"), str(src))
    (wheel,) = (tmp / "dist").glob("ncp_local-*.whl")
    venv = tmp / "venv"
    # The interpreter these tests run on (3.11 or 3.13 in `make test`), in a venv of its own.
    _uv("venv", "--quiet", "--python", sys.executable, str(venv))
    _uv("pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel))
    return wheel, venv / "bin"


def test_wheel_carries_conf_prompts_and_specs(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in BUNDLED:
        in_clone = {f"ncp_local/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / folder).rglob("*") if p.is_file()}
        assert in_clone, folder
        assert in_clone <= names, f"{folder}/ files missing from the wheel: {sorted(in_clone - names)[:5]}"
    # Every file the package reads that is not Python (report/assets/: an installed rig's reports need
    # their styles), and Hydra's launcher plugin (hydra/launcher=batched).
    assets = {f"ncp_local/{p.relative_to(ROOT / 'ncp_local').as_posix()}" for p in (ROOT / "ncp_local").rglob("*")}
    assets = {n for n in assets if (ROOT / n).is_file() and not n.endswith((".py", ".pyc")) and "__pycache__" not in n}
    assert assets and assets <= names, sorted(assets - names)
    assert "hydra_plugins/ncp_batched_launcher/batched_launcher.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "ncp-local = ncp_local.entry:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_ncp_local_runs_and_reports_from_an_empty_folder(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, bin_dir = installed
    run = subprocess.run(
        [str(bin_dir / "ncp-local"), "engine=scripted", "limit=1", "max_turns=2", "progress=false"],
        cwd=tmp_path,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    # The local dataset the wheel carries, not this clone's specs/.
    site = Path(manifest["dataset"]["path"]).resolve()
    assert site.parent.name == "ncp_local" and "site-packages" in site.parts, site
    assert len(list((run_dir / "results").glob("*.json"))) == 1

    report = subprocess.run(
        [str(bin_dir / "ncp-local"), "mode=report", f"runs=[runs/{run_dir.name}]"],
        cwd=tmp_path,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    with (run_dir / "report" / "results.csv").open(newline="") as f:
        (row,) = csv.DictReader(f)  # one run, its one episode
    assert row["episodes"] == "1", row
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing else written where it ran


@pytest.mark.parametrize(
    "args",
    [("dataset=ncp_bench",), ("prompts.dir=/nonexistent/pack",)],
    ids=["no-dataset-path", "no-prompts-dir"],
)
def test_bad_input_is_one_line_as_from_a_clone(installed: tuple[Path, Path], tmp_path: Path, args: tuple[str]) -> None:
    _, bin_dir = installed
    line = ("engine=scripted", "limit=1", *args)
    wheel = subprocess.run(
        [str(bin_dir / "ncp-local"), *line],
        cwd=tmp_path,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    clone = run_cli(*line, cwd=tmp_path, env=_user_env())
    assert wheel.returncode == clone.returncode == EXIT_BAD_INPUT
    assert wheel.stderr.splitlines() == clone.stderr.splitlines()
    (error,) = wheel.stderr.splitlines()
    assert error.startswith("error: ") and ("dataset.path" in error or "prompts.dir" in error), error
    assert list(tmp_path.iterdir()) == []


def test_a_wheel_user_gets_a_wheel_users_advice(installed: tuple[Path, Path], tmp_path: Path) -> None:
    """Without vLLM (the wheel installed without its engine extra), the default engine is refused with the
    install command that fits a wheel, not the clone's `make install`."""
    _, bin_dir = installed
    proc = subprocess.run(
        [str(bin_dir / "ncp-local"), "limit=1"], cwd=tmp_path, env=_user_env(), capture_output=True, text=True
    )
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert "pip install 'ncp-local[cpu]'" in line and "make install" not in line and "-e '." not in line, line


def test_the_submitter_dry_runs_from_the_wheel(installed: tuple[Path, Path], tmp_path: Path) -> None:
    """`ncp-local-submit`: the job script the wheel carries, the tasks run by the package (no run.py)."""
    _, bin_dir = installed
    proc = subprocess.run(
        [str(bin_dir / "ncp-local-submit"), "--dry-run", "--shards", "1", "--", "engine=scripted", "limit=1"],
        cwd=tmp_path,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sbatch = proc.stdout.splitlines()[-1].split()
    script = Path(next(a for a in sbatch if a.endswith(".sbatch")))
    assert script.is_file() and script.parent.parent.name == "ncp_local" and "site-packages" in script.parts
    assert "NCP_RUN=," in sbatch[next(i for i, a in enumerate(sbatch) if a.startswith("--export="))]
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing
