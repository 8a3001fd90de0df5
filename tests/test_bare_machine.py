"""A machine short of what the rig expects, as a user meets it (issue 53): no writable home, config or
temporary folder anywhere, and no engine package installed. Each ends in one line, never a traceback.

Both are properties of a fresh process (what matplotlib does as it first imports, what the import system
finds), so each runs `python run.py` as a subprocess with a `sitecustomize` that makes the machine so.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.report import mpl_home

ROOT = Path(__file__).resolve().parent.parent

# Python's own lookup finds no temporary directory (as on a node whose /tmp, /var/tmp and working
# folder are all read-only: tempfile then raises). Root can write anywhere, so this is simulated.
NO_TEMPORARY_DIRECTORY = """
import errno, tempfile
def _nowhere():
    raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/proc/no-tmp']")
tempfile.tempdir = None
tempfile._get_default_tempdir = _nowhere
"""

# Packages as if never installed: the import system's path finder does not find them (find_spec gives
# None and `import` raises ModuleNotFoundError, exactly as without them).
NOT_INSTALLED = """
import importlib.machinery, os
_hidden = set(os.environ["NCP_TEST_NOT_INSTALLED"].split(","))
_find = importlib.machinery.PathFinder.find_spec
def _find_spec(name, path=None, target=None):
    return None if name.split(".")[0] in _hidden else _find(name, path, target)
importlib.machinery.PathFinder.find_spec = _find_spec
"""


def _run(tmp_path: Path, site: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / "site"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(site, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    full = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]),
        "NCP_LOCAL_CACHE": str(tmp_path / "cache"),
        **env,
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=work,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*.json")}


def test_no_writable_folder_anywhere(tmp_path: Path) -> None:
    """Home, config, cache and temporary folders all unwritable: a read-only out_dir is the usual one
    line, and a report is written whole (matplotlib gets a folder inside it), the run untouched."""
    run = tmp_path / "run"
    done = run_cli("engine=scripted", "limit=2", "max_turns=2", "progress=false", f"out_dir={run}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = _tree(run / "results")
    nowhere = {
        "HOME": "/proc/no-home",
        "TMPDIR": "/proc/no-tmp",
        "MPLCONFIGDIR": "/proc/no-mpl",
        "XDG_CONFIG_HOME": "/proc/no-config",
        "XDG_CACHE_HOME": "/proc/no-cache",
    }
    # The out_dir refused in one line (it was a matplotlib traceback from the report's import).
    proc = _run(tmp_path, NO_TEMPORARY_DIRECTORY, ["engine=scripted", "out_dir=/proc/self/ncp-run"], nowhere)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("error: /proc/self/ncp-run: out_dir: cannot be written")
    assert "\n" not in proc.stderr.strip()
    # A report of the finished run: every file, the plots too, and the run's results unharmed.
    proc = _run(tmp_path, NO_TEMPORARY_DIRECTORY, ["mode=report", f"runs=[{run}]"], nowhere)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr
    report = run / "report"
    for name in ("results.md", "survival.png", "survival.svg", "endings.png", "index.html"):
        assert (report / name).stat().st_size > 0, name
    assert (report / mpl_home.FOLDER).is_dir()  # where matplotlib was told to write
    assert _tree(run / "results") == results


def test_plots_skipped_when_no_folder_can_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When even the report's folder cannot take matplotlib's, `ready` says why (the report then writes
    its tables and says `warning:` in one line, see report/build.py)."""
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)
    monkeypatch.setattr(mpl_home, "_has_a_folder", lambda: False)
    monkeypatch.setattr(mpl_home, "_writable", lambda folder: False)
    why = mpl_home.ready(tmp_path / "report")
    assert why and "matplotlib has no writable folder" in why and str(tmp_path / "report") in why


def test_default_run_without_the_engine_package(tmp_path: Path) -> None:
    """vLLM (and its grammar compiler) not installed: the default command's line names the engine's
    package and the install command, not the grammar check's xgrammar."""
    proc = _run(tmp_path, NOT_INSTALLED, [], {"NCP_TEST_NOT_INSTALLED": "vllm,xgrammar"})
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and line.startswith("error: config: engine: engine=vllm needs the vllm package"), line
    assert "make install" in line and "xgrammar" not in line, line
    assert not (tmp_path / "work" / "runs").exists()
