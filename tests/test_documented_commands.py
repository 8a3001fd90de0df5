"""Every command README.md and docs/ show runs as written (issues 53 and 57).

The lines are read from the pages (tests/documented_commands.py): `run.py`, `slurm/submit.py` and the
installed `ncp-local` commands. A `slurm/submit.py` line runs with `--dry-run --skip-model-check` added
(what a user checks on a login node: options, config, dataset, shards and served layout are all refused
there as they would be before a real submission, the models the pages name live on the GPU nodes), in
this process and against this machine's Slurm where it has one (scripts/start_slurm.sh), marked or not.
Any other line the page marks as needing what this machine lacks (`# ... needs GPUs`, `loads a model`,
`needs Slurm`, `needs a server`, `needs the official code`, `needs the run above`) is only parsed: its
overrides composed and validated as `run.py` would, each point of a sweep, and every path it reads
(`runs=`, `dataset.path=`, `prompts.dir=`, `review.sheet=`, `sources=`, a validated `submission=`) must
exist or be one an earlier line of the page makes (an `out_dir=`-like key of a parsed line, or the run
directory or sweep folder a dry run printed); `/path/to/...` stands for what a `needs the official
code` line needs. Every other line runs, in this process (tests/cli_runner.py) and in page order, with
nothing added: a page's lines share a folder, so a line reads what the lines above it wrote. A line ends
with exit 0, or with the code its comment starts with (`# exit 2: ...`). The README's lines run first;
every docs page starts from a copy of the folder they left (its `runs/a`, `runs/b` and `multirun/seeds`
are what the pages' `runs/a` and `runs/b` name).

The set-up is the README's: `NCP_BENCH_DATASET` names the official release, and where it is not set the
test looks where `make` does (the Makefile's default, `../shared/ncp-bench/dataset`). Without it the lines
that name the dataset (and the lines that read what those make) are skipped, each page's others still
run; with `NCP_REQUIRE_DATASET` set (.ci/run sets it) the test fails instead.

An unmarked line that would start a model engine fails (so the test never starts one by surprise),
and so does a marked line that starts none (a mark must say something true).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import glob
import io
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hydra._internal.utils import get_args_parser
from omegaconf import OmegaConf

from cli_runner import CliResult, run_cli, run_submit
from documented_commands import ROOT, Command, commands, commands_in, pages
from ncp_local import config as config_mod
from ncp_local.bindings import bind
from ncp_local.engines.settings import EMBEDDED
from ncp_local.execution import points
from ncp_local.modes._registry import find

# The modes that start the engines of the roles they use (the others read files or plan on paper).
ENGINE_MODES = ("run", "bench", "reaudit", "plant", "build")


# Where `make` looks when NCP_BENCH_DATASET is not set (the Makefile's default).
MAKE_DATASET = ROOT.parent / "shared" / "ncp-bench" / "dataset"
# The keys whose value is a path a line reads, and those it writes (`submission=`: by mode).
READS = ("runs", "dataset.path", "prompts.dir", "review.sheet", "sources")
WRITES = ("out_dir", "out", "export.out", "report.out", "hydra.sweep.dir")
# What a dry run of the submitter prints for the folder the submission makes.
MADE_BY_SUBMIT = re.compile(r"^(?:run directory|sweep folder): (\S+)", re.MULTILINE)
PLACEHOLDER = "/path/to/"  # the official code's folder, on a line marked as needing it


def _dataset() -> str | None:
    """The official release, found as `make` finds it; None when it is not there (a failure when CI asks)."""
    path = os.environ.get("NCP_BENCH_DATASET") or str(MAKE_DATASET)
    if Path(path).is_dir():
        return path
    if os.environ.get("NCP_REQUIRE_DATASET"):
        pytest.fail(f"official dataset not found at {path} (NCP_REQUIRE_DATASET is set: CI needs it)")
    return None


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
    and validated (raises on a bad one). The first point was composed by `_engine_use` already."""
    each, _ = _run_overrides(cmd.args)
    for overrides in each[1:]:
        _composed(overrides)


def _sandbox(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "specs"  # pages name the rig's own files relatively (`sources=specs/sources.yaml`)
    if not link.exists():
        link.symlink_to(ROOT / "specs")
    return folder


def _env(folder: Path, dataset: str | None) -> dict[str, str]:
    env = {**os.environ, "NCP_LOCAL_CACHE": str(folder / ".cache")}
    if dataset:
        env["NCP_BENCH_DATASET"] = dataset
    return env


def _values(arg: str) -> tuple[str, list[str]]:
    """An override's key (without +/~) and its values (a list's items)."""
    key, _, value = arg.partition("=")
    value = os.path.expandvars(value)
    items = value[1:-1].split(",") if value.startswith("[") and value.endswith("]") else [value]
    return key.lstrip("+~"), [v for v in items if v]


def _paths(cmd: Command, mode: str) -> tuple[list[str], list[str]]:
    """The paths a line reads and the paths it writes, as its overrides name them."""
    reads: list[str] = []
    writes: list[str] = []
    for arg in cmd.args:
        key, values = _values(arg)
        if key in READS or (key == "submission" and mode == "validate"):
            reads += values
        elif key in WRITES or (key == "submission" and mode == "submission"):
            writes += values
    return reads, writes


def _needs_dataset(cmd: Command) -> bool:
    return any(_values(a) == ("dataset", ["ncp_bench"]) for a in cmd.args) or "NCP_BENCH_DATASET" in cmd.text


@dataclass
class Folder:
    """A page's folder and what its lines promised to make there without making it (a parsed line's
    outputs, a dry run's run directory) or could not make (a skipped line's)."""

    path: Path
    promised: set[str] = field(default_factory=set)  # absolute paths
    lost: set[str] = field(default_factory=set)

    def absolute(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.path, path))

    def among(self, path: str, made: set[str]) -> bool:
        pattern = self.absolute(path)
        return any(fnmatch.fnmatch(m, pattern) or m == pattern for m in made)

    def missing(self, path: str, marked: str | None) -> bool:
        if path.startswith(PLACEHOLDER) and marked == "needs the official code":
            return False
        return not glob.glob(self.absolute(path)) and not self.among(path, self.promised)


def _models_here(overrides: list[str]) -> bool:
    """Whether every role's model of a submitter line (its first point) is on this machine."""
    each, _ = _run_overrides(tuple(overrides))
    cfg = _composed(each[0])
    paths = [getattr(cfg, role).model.path for role in ("narrator", "player", "auditor")]
    return all(p == EMBEDDED or (Path(p).expanduser() / "config.json").is_file() for p in paths)


def _with_dry_run(args: tuple[str, ...]) -> tuple[list[str], str]:
    """A submitter line's arguments with `--dry-run` among its own options, and `--skip-model-check` when
    the models it names are not on this machine (they live on the GPU nodes); (arguments, what was added)."""
    args_list = [os.path.expandvars(a) for a in args]
    cut = args_list.index("--") if "--" in args_list else len(args_list)
    extra = [] if "--dry-run" in args_list[:cut] else ["--dry-run"]
    if "--skip-model-check" not in args_list[:cut] and not _models_here(args_list[cut + 1 :]):
        extra.append("--skip-model-check")
    return [*args_list[:cut], *extra, *args_list[cut:]], " ".join(extra)


def _play(cmds: list[Command], folder: Path) -> tuple[list[str], dict[str, int]]:
    """Each of `cmds` in `folder`, in order: (what went wrong, counts)."""
    problems: list[str] = []
    counts = {"ran": 0, "dry-run": 0, "parsed": 0, "skipped": 0}
    dataset = _dataset()
    env = _env(folder, dataset)
    here = Folder(folder)
    with _dataset_env(dataset):
        for cmd in cmds:
            problems += _one(cmd, here, env, dataset is not None, counts)
    return problems, counts


@contextlib.contextmanager
def _dataset_env(dataset: str | None) -> Iterator[None]:
    """NCP_BENCH_DATASET in this process while the lines are composed (their config reads it)."""
    before = os.environ.get("NCP_BENCH_DATASET")
    if dataset:
        os.environ["NCP_BENCH_DATASET"] = dataset
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("NCP_BENCH_DATASET", None)
        else:
            os.environ["NCP_BENCH_DATASET"] = before


def _one(cmd: Command, here: Folder, env: dict[str, str], have_dataset: bool, counts: dict[str, int]) -> list[str]:
    """One line: run, dry-run, parsed or skipped; what went wrong with it."""
    try:
        mode, model = _engine_use(cmd)
    except Exception as exc:
        return [f"{cmd.where}: does not compose: {type(exc).__name__}: {exc}\n    {cmd.text}"]
    reads, writes = _paths(cmd, mode)
    if not have_dataset and (_needs_dataset(cmd) or any(here.among(r, here.lost) for r in reads)):
        here.lost.update(here.absolute(w) for w in writes)
        counts["skipped"] += 1
        return []
    if cmd.script == "slurm/submit.py":
        if "--dry-run" not in cmd.args and cmd.needs != "needs Slurm":
            return [f"{cmd.where}: submits to Slurm but is not marked 'needs Slurm'\n    {cmd.text}"]
        args, added = _with_dry_run(cmd.args)
        # The user's own model cache (a dry run loads nothing): the embedded model is where `make model` put it.
        cache = {"NCP_LOCAL_CACHE": os.environ["NCP_LOCAL_CACHE"]} if "NCP_LOCAL_CACHE" in os.environ else {}
        user = {k: v for k, v in env.items() if k != "NCP_LOCAL_CACHE"} | cache
        done = _timed(cmd, run_submit, args, here.path, user)
        counts["dry-run"] += 1
        here.promised.update(MADE_BY_SUBMIT.findall(done.stdout))
        return _exit_problem(cmd, done, f" (with {added})" if added else "")
    if cmd.needs:
        if not model and mode in ENGINE_MODES and cmd.needs in ("needs GPUs", "loads a model"):
            return [f"{cmd.where}: marked '{cmd.needs}' but starts no model\n    {cmd.text}"]
        counts["parsed"] += 1
        try:
            _parse_only(cmd)
        except Exception as exc:
            return [f"{cmd.where}: does not parse: {type(exc).__name__}: {exc}\n    {cmd.text}"]
        absent = [r for r in reads if here.missing(r, cmd.needs)]
        here.promised.update(here.absolute(w) for w in writes)
        if absent:
            return [
                f"{cmd.where}: reads {', '.join(absent)}, which neither exists nor is made by a line above\n"
                f"    {cmd.text}"
            ]
        return []
    if model:
        return [
            f"{cmd.where}: starts a model engine but is not marked (end its comment with 'loads a model' "
            f"or 'needs GPUs')\n    {cmd.text}"
        ]
    # Expanded as the shell would: `$NCP_BENCH_DATASET` and the like.
    done = _timed(cmd, run_cli, [os.path.expandvars(a) for a in cmd.args], here.path, env)
    counts["ran"] += 1
    return _exit_problem(cmd, done, "")


def _timed(cmd: Command, runner: Any, args: list[str], folder: Path, env: dict[str, str]) -> CliResult:
    began, cpu = time.monotonic(), time.process_time()
    done: CliResult = runner(*args, cwd=folder, env=env)
    TIMES.append((time.monotonic() - began, time.process_time() - cpu, cmd.where))
    return done


def _exit_problem(cmd: Command, done: CliResult, how: str) -> list[str]:
    if done.returncode == cmd.exit_code:
        return []
    tail = (done.stderr.strip() or done.stdout.strip())[-1500:]
    return [f"{cmd.where}: exit {done.returncode}{how}\n    {cmd.text}\n    {tail}"]


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
COUNTS: dict[str, dict[str, int]] = {}  # each page's counts (this worker's pages)


def _said(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counts.items())


README = ROOT / "README.md"
DOCS = [p for p in pages() if p != README and commands(p)]


@pytest.fixture(scope="module")
def readme_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str], dict[str, int]]]:
    """The README's lines played once a session, not once per xdist worker (about a minute each): the first
    worker here plays them into the session's shared temporary folder; another waits for it, then reads
    what it found. Every page's test plays on a copy."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # <session>/popen-gw0 -> <session>, which the workers share
    folder, found = root / "readme", root / "readme.json"
    with (root / "readme.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if found.exists():
            problems, counts = json.loads(found.read_text())
        else:
            problems, counts = _play(commands(README), _sandbox(folder))
            found.write_text(json.dumps([problems, counts]))
    yield folder, problems, counts


def test_readme_commands_run_as_written(readme_folder: tuple[Path, list[str], dict[str, int]]) -> None:
    _, problems, counts = readme_folder
    assert not problems, "\n".join(problems)
    assert counts["ran"] >= 5
    COUNTS["README.md"] = counts
    if counts["skipped"]:
        pytest.skip(f"{counts['skipped']} line(s) need the official dataset, not found ({MAKE_DATASET})")


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_docs_commands_run_as_written(
    page: Path, readme_folder: tuple[Path, list[str], dict[str, int]], tmp_path: Path
) -> None:
    start = time.monotonic()
    folder = tmp_path / "work"
    shutil.copytree(readme_folder[0], folder, symlinks=True)
    problems, counts = _play(commands(page), folder)
    assert not problems, "\n".join(problems)
    if page.name == "analysis.md":
        missing = _worked_example(page, folder)
        assert not missing, f"{page}: the worked example's quoted figures are not what it prints: {missing}"
    took = time.monotonic() - start
    COUNTS[str(page.relative_to(ROOT))] = counts
    print(f"{page.relative_to(ROOT)}: {_said(counts)} in {took:.1f} s")
    if counts["skipped"]:
        pytest.skip(f"{counts['skipped']} line(s) need the official dataset, not found ({MAKE_DATASET})")


def test_zz_times() -> None:
    """Not a check: the slowest lines this worker ran (pytest -s shows them)."""
    for took, cpu, where in sorted(TIMES, reverse=True)[:10]:
        print(f"{took:6.1f} s ({cpu:5.1f} s CPU)  {where}")
    print(f"{len(TIMES)} lines ran: {sum(t[0] for t in TIMES):.0f} s, {sum(t[1] for t in TIMES):.0f} s CPU")
    total = {k: sum(c[k] for c in COUNTS.values()) for k in ("ran", "dry-run", "parsed", "skipped")}
    print(f"{len(COUNTS)} pages: {_said(total)}")


# One broken line of each kind the test reads, on a page of its own: each must be reported.
BROKEN = {
    "a dry run refuses --shards": "python slurm/submit.py --shards 1000 -- engine=scripted   # needs Slurm",
    "a dry run refuses the mode": "python slurm/submit.py --shards 2 -- mode=report   # needs Slurm",
    "a dry run refuses the layout": (
        "python slurm/submit.py --shards 1 --serve auditor --serve-gpus 0 --serve-nodes 31 -- engine=scripted"
        "   # needs Slurm"
    ),
    "a parsed line reads what is not there": (
        "python run.py mode=reaudit runs=[/no/such/dir] auditor=qwen3_32b   # same transcripts; needs GPUs"
    ),
    "an installed command fails": "ncp-local mode=report runs=[runs/never-made]",
}


@pytest.mark.parametrize("line", BROKEN.values(), ids=list(BROKEN))
def test_a_broken_line_is_reported(line: str, tmp_path: Path) -> None:
    cmds = commands_in(f"```bash\n{line}\n```\n", "broken.md")
    assert len(cmds) == 1
    problems, _ = _play(cmds, _sandbox(tmp_path))
    assert len(problems) == 1
    print(problems[0])


def test_without_the_dataset_its_lines_skip_and_ci_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No dataset where the README or `make` says: the lines naming it are skipped, and so is a line reading
    what they would have made; the others still run. CI (NCP_REQUIRE_DATASET) fails instead."""
    page = (
        "```bash\n"
        "python run.py engine=scripted dataset=ncp_bench max_turns=2 out_dir=runs/official\n"
        "python run.py mode=report runs=[runs/official]\n"
        "python run.py mode=plan narrator=qwen3 player=qwen3 auditor=qwen3 plan.gpus=[H100-80GB]\n"
        "```\n"
    )
    monkeypatch.delenv("NCP_BENCH_DATASET", raising=False)
    monkeypatch.delenv("NCP_REQUIRE_DATASET", raising=False)
    monkeypatch.setitem(globals(), "MAKE_DATASET", tmp_path / "no-dataset")
    problems, counts = _play(commands_in(page, "page.md"), _sandbox(tmp_path / "work"))
    assert (problems, counts) == ([], {"ran": 1, "dry-run": 0, "parsed": 0, "skipped": 2})
    monkeypatch.setenv("NCP_REQUIRE_DATASET", "1")
    with pytest.raises(pytest.fail.Exception, match="NCP_REQUIRE_DATASET is set"):
        _play(commands_in(page, "page.md"), _sandbox(tmp_path / "ci"))
