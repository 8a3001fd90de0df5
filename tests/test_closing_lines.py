"""A mode's closing line names only files that are there (issue 57, item 6): `mode=report` lists its
plots only when they were written (they are skipped when matplotlib has no folder it can write).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.report import build as report_build

ROOT = Path(__file__).resolve().parent.parent
SPEC_ID = "red_riding_hood"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("closing")
    (ws / "data" / "specs").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "specs" / f"{SPEC_ID}.yaml", ws / "data" / "specs")
    (ws / "data" / "index.yaml").write_text(f"specs: [{SPEC_ID}]\n")
    done = run_cli("engine=scripted", "max_turns=1", "progress=false", f"dataset.path={ws}/data", f"out_dir={ws}/run")
    assert done.returncode == 0, done.stderr
    return ws / "run"


def listed(stdout: str, out: Path) -> list[Path]:
    """The files the closing `report: DIR (a.md/.csv, b.csv, ...)` line names, as paths."""
    line = next(x for x in stdout.splitlines() if x.startswith(f"report: {out} ("))
    files = []
    for item in re.fullmatch(rf"report: {re.escape(str(out))} \((.*)\)", line).group(1).split(", "):  # type: ignore[union-attr]
        first, *more = item.split("/.")
        stem, _, suffix = first.rpartition(".")
        files += [out / f"{stem}.{suffix}", *(out / f"{stem}.{s}" for s in more)]
    return files


@pytest.mark.parametrize("plots", [True, False], ids=["with-plots", "plots-skipped"])
def test_the_report_lists_only_what_it_wrote(
    plots: bool, finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not plots:  # as when matplotlib finds no folder it can write (report/mpl_home.py)
        monkeypatch.setattr(report_build, "plots_ready", lambda out: "matplotlib has no writable folder")
    out = tmp_path / "report"
    result = run_cli("mode=report", f"runs=[{finished}]", f"report.out={out}", "report.resamples=50")
    assert result.returncode == 0, result.stderr
    files = listed(result.stdout, out)
    assert all(f.is_file() for f in files), [f for f in files if not f.is_file()]
    written = {p for p in out.glob("*") if p.is_file() and not p.name.startswith(".")}
    assert set(files) == written  # and nothing written goes unnamed
    assert ((out / "survival.png") in files) is plots
    assert ((out / "index.html") in files) is True
    if not plots:
        assert "plots skipped" in result.stderr
