"""Every command README.md and docs/ show runs as written (issue 53).

The lines are read from the pages (tests/documented_commands.py). A line the page marks as needing
what this machine lacks (`# ... needs GPUs`, `loads a model`, `needs Slurm`, `needs a server`,
`needs the official code`, `needs the run above`) is only parsed: its overrides composed and validated
as `run.py` would, each point of a sweep, and a submitter line's options read. Every other line runs, in this process
(tests/cli_runner.py) and in page order, with nothing added: a page's lines share a folder, so a line
reads what the lines above it wrote. A line ends with exit 0, or with the code its comment starts with
(`# exit 2: ...`). The README's lines run first; every docs page starts from a copy
of the folder they left (its `runs/a`, `runs/b` and `multirun/seeds` are what the pages' `runs/a` and
`runs/b` name). The set-up is the README's: `NCP_BENCH_DATASET` names the official release.

An unmarked line that would start a model engine fails (so the test never starts one by surprise),
and so does a marked line that starts none (a mark must say something true).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra._internal.utils import get_args_parser
from omegaconf import OmegaConf

from cli_runner import CliResult, run_cli, run_submit
from documented_commands import ROOT, Command, commands, pages
from ncp_local import config as config_mod
from ncp_local.bindings import bind
from ncp_local.execution import points
from ncp_local.launch.submit import parse_args as submit_args
from ncp_local.modes._registry import find

# The modes that start the engines of the roles they use (the others read files or plan on paper).
ENGINE_MODES = ("run", "bench", "reaudit", "build")


def _dataset() -> str:
    path = os.environ.get("NCP_BENCH_DATASET")
    if not path or not Path(path).is_dir():
        pytest.skip("official dataset not available (the README's set-up: export NCP_BENCH_DATASET=...)")
    return path


def _composed(overrides: list[str]) -> Any:
    raw = OmegaConf.to_container(config_mod.compose(overrides), resolve=True)
    cfg = config_mod.validate(raw)  # type: ignore[arg-type]
    find(cfg.mode)
    return cfg


def _run_overrides(args: tuple[str, ...]) -> tuple[list[list[str]], bool]:
    """The overrides of each point a run.py line makes (one for a single run), and whether it is a
    Hydra option line (--help, --cfg) that composes nothing of its own."""
    parsed = get_args_parser().parse_args(list(args))
    if parsed.help or parsed.hydra_help or parsed.info or parsed.cfg:
        return [], True
    if not parsed.multirun:
        return [list(parsed.overrides)], False
    grid = points.expand(parsed.overrides)
    return [list(p.overrides) for p in grid.points(most=64)], False


def _engine_use(cmd: Command) -> tuple[str, bool]:
    """The line's mode and whether it starts a model engine (a sweep's first point: its points share their
    engines' kinds)."""
    if cmd.script != "run.py":
        return "submit", False
    each, _ = _run_overrides(cmd.args)
    if not each:
        return "help", False
    cfg = _composed(each[0])
    return cfg.mode, cfg.mode in ENGINE_MODES and any(b.kind.runs_model for b in bind(cfg))


def _parse_only(cmd: Command) -> None:
    """What can be checked without the GPUs, cluster or model: options and overrides, every point composed
    and validated (raises on a bad one)."""
    args = list(cmd.args)
    if cmd.script == "slurm/submit.py":
        _, args = submit_args(args)
    each, _ = _run_overrides(tuple(args))
    for overrides in each:
        _composed(overrides)


def _sandbox(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "specs"  # pages name the rig's own files relatively (`sources=specs/sources.yaml`)
    if not link.exists():
        link.symlink_to(ROOT / "specs")
    return folder


def _env(folder: Path) -> dict[str, str]:
    return {**os.environ, "NCP_LOCAL_CACHE": str(folder / ".cache"), "NCP_BENCH_DATASET": _dataset()}


def _play(page: Path, folder: Path) -> tuple[list[str], dict[str, int]]:
    """Each command of `page` in `folder`, in order: (what went wrong, counts)."""
    problems: list[str] = []
    counts = {"ran": 0, "parsed": 0}
    env = _env(folder)
    for cmd in commands(page):
        try:
            mode, model = _engine_use(cmd)
        except Exception as exc:
            problems.append(f"{cmd.where}: does not compose: {type(exc).__name__}: {exc}\n    {cmd.text}")
            continue
        if cmd.needs:
            if not model and mode in ENGINE_MODES and cmd.needs in ("needs GPUs", "loads a model"):
                problems.append(f"{cmd.where}: marked '{cmd.needs}' but starts no model\n    {cmd.text}")
                continue
            try:
                _parse_only(cmd)
            except Exception as exc:
                problems.append(f"{cmd.where}: does not parse: {type(exc).__name__}: {exc}\n    {cmd.text}")
            counts["parsed"] += 1
            continue
        if model:
            problems.append(
                f"{cmd.where}: starts a model engine but is not marked (end its comment with 'loads a model' "
                f"or 'needs GPUs')\n    {cmd.text}"
            )
            continue
        if cmd.script == "slurm/submit.py" and "--dry-run" not in cmd.args:
            problems.append(f"{cmd.where}: submits to Slurm but is not marked 'needs Slurm'\n    {cmd.text}")
            continue
        runner = run_cli if cmd.script == "run.py" else run_submit
        # Expanded as the shell would: `$NCP_BENCH_DATASET` and the like.
        args = [os.path.expandvars(a) for a in cmd.args]
        began, cpu = time.monotonic(), time.process_time()
        done: CliResult = runner(*args, cwd=folder, env=env)
        TIMES.append((time.monotonic() - began, time.process_time() - cpu, cmd.where))
        counts["ran"] += 1
        if done.returncode != cmd.exit_code:
            tail = (done.stderr.strip() or done.stdout.strip())[-1500:]
            problems.append(f"{cmd.where}: exit {done.returncode}\n    {cmd.text}\n    {tail}")
    return problems, counts


def _worked_example(page: Path, folder: Path) -> list[str]:
    """Run a page's worked example (its Python after `### A worked example`) where the page's commands
    ran; the figure rows the page quotes (backticked, with six decimals) that it does not print."""
    section = page.read_text(encoding="utf-8").split("### A worked example", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, f"{page}: no Python in its worked example"
    quoted = re.findall(r"`([^`]*\d\.\d{6}[^`]*)`", section)
    assert quoted, f"{page}: the worked example quotes no figures"
    printed = io.StringIO()
    here = os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(found.group(1), str(page), "exec"), {})
    finally:
        os.chdir(here)
    rows = {" ".join(line.split()) for line in printed.getvalue().splitlines()}
    return [q for q in quoted if " ".join(q.split()) not in rows]


TIMES: list[tuple[float, float, str]] = []  # (seconds, CPU seconds, where) of each line run

README = ROOT / "README.md"
DOCS = [p for p in pages() if p != README and commands(p)]


@pytest.fixture(scope="module")
def readme_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str], dict[str, int]]]:
    folder = _sandbox(tmp_path_factory.mktemp("readme"))
    problems, counts = _play(README, folder)
    yield folder, problems, counts


def test_readme_commands_run_as_written(readme_folder: tuple[Path, list[str], dict[str, int]]) -> None:
    _, problems, counts = readme_folder
    assert not problems, "\n".join(problems)
    assert counts["ran"] >= 5


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_docs_commands_run_as_written(
    page: Path, readme_folder: tuple[Path, list[str], dict[str, int]], tmp_path: Path
) -> None:
    start = time.monotonic()
    folder = tmp_path / "work"
    shutil.copytree(readme_folder[0], folder, symlinks=True)
    problems, counts = _play(page, folder)
    assert not problems, "\n".join(problems)
    if page.name == "analysis.md":
        missing = _worked_example(page, folder)
        assert not missing, f"{page}: the worked example's quoted figures are not what it prints: {missing}"
    took = time.monotonic() - start
    print(f"{page.relative_to(ROOT)}: {counts['ran']} ran, {counts['parsed']} parsed in {took:.1f} s")


def test_zz_times() -> None:
    """Not a check: the slowest lines this worker ran (pytest -s shows them)."""
    for took, cpu, where in sorted(TIMES, reverse=True)[:10]:
        print(f"{took:6.1f} s ({cpu:5.1f} s CPU)  {where}")
    print(f"{len(TIMES)} lines ran: {sum(t[0] for t in TIMES):.0f} s, {sum(t[1] for t in TIMES):.0f} s CPU")
