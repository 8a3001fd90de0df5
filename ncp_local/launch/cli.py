"""The command line: `python run.py [group=option ...] [key=value ...]`.

`run.py` is a thin script that calls `main`; the tests call the same `main` in
their own process (tests/cli_runner.py `run_cli`), so what they check is what a user
runs. The modes are listed in ncp_local/modes (`--help` prints them).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ncp_local.config import REPO_ROOT, bounded, compose, hydra_error_line, override_error_line
from ncp_local.config.suggest import argparse_line
from ncp_local.errors import InputError
from ncp_local.execution import points
from ncp_local.exits import EXIT_BAD_INPUT, EXIT_SIGNAL, EXIT_SWEEP_FAILED, INTERRUPTED_LINE, STOPPED_BY_SIGNAL
from ncp_local.launch.help import register as register_help  # --help: conf/hydra/help/ncp.yaml
from ncp_local.modes import find
from ncp_local.resources import CONF_DIR
from ncp_local.rundir.layout import shared_run_dir
from ncp_local.rundir.places import check_outputs

EXIT_SIGINT = EXIT_SIGNAL["SIGINT"]
# A sweep up to this many points is checked point by point before the first
# starts; a larger one value by value (each swept key alone, the others at
# their first value), which catches every bad value but not a bad combination.
MAX_CHECKED_POINTS = 64
# A local sweep's index lists its points from the start up to this many (past it: each as it starts).
MAX_PLANNED_POINTS = 10_000


OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT), replace=True)
register_help()


def check_overrides(argv: list[str]) -> str | None:
    """Compose the config for the command line; a bad override is one line.

    Hydra itself reports a wrong key or group option in several lines and
    exits 1; checking first keeps the rig's contract (one line, exit 2). A
    sweep (`-m`) has every point composed; on the basic launcher each is also
    validated (config, method options, engine and model paths, dataset)
    before the first one starts (the batched launcher validates its points).
    """
    args_parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        raise _BadArgs(message)

    args_parser.error = refuse  # type: ignore[method-assign]  # argparse prints its whole usage first
    try:
        args = args_parser.parse_args(argv)
    except _BadArgs as exc:
        said = argparse_line(str(exc), args_parser._option_string_actions)
        return f"command line: {said} (options such as -m go before the overrides; see --help)"
    if sum(map(bool, (args.run, args.multirun, args.cfg, args.info, args.shell_completion))) > 1:
        return "only one of --run, --multirun, --cfg, --info and --shell-completion can be given"
    if (
        args.help
        or args.hydra_help
        or args.info
        or args.shell_completion
        or args.experimental_rerun
        or args.config_path
        or args.config_dir
    ):
        return None  # not a composition of our own config: leave it to Hydra
    name = args.config_name or "config"
    parser = OverridesParser.create()
    for line in args.overrides:
        try:
            parser.parse_override(line)
        except Exception as exc:
            return f"config override {line}: {hydra_error_line(exc)}"
    point: tuple[str, ...] = ()
    try:
        if not args.multirun:
            compose(args.overrides, name)
            return None
        grid = points.expand(args.overrides, name)  # a glob() sweep is left to Hydra's own sweeper
        # A point the rig's checks refuse is named now, before anything starts, and the others
        # run (its job is not run: it ends EXIT_BAD_INPUT without saying it again, and the sweep ends
        # with EXIT_SWEEP_FAILED).
        # Hydra's own errors (an unknown key or option) refuse the whole sweep: Hydra's sweeper
        # would refuse it anyway, in many lines, before any launcher starts.
        batched = grid.launcher.endswith(".BatchedLauncher")
        if not batched and not grid.unexpanded and grid.count() <= MAX_PLANNED_POINTS:
            # The basic launcher's index lists every point from the first one on (mode=status reads it).
            PLANNED[:] = [p.overrides for p in grid.points()]
        datasets: dict[str, Any] = {}  # datasets already read (a sweep rarely varies it)
        placed: list[tuple[str, Any, str]] = []  # (point, run directory, identity) of points with an out_dir
        for p in grid.points(most=MAX_CHECKED_POINTS):
            point = p.swept
            if batched:
                # The batched launcher runs the rig's checks on every point itself, before any starts.
                compose(list(p.overrides), name)
                continue
            try:
                checked = points.check(points.load(p.overrides, name), datasets=datasets)
                check_outputs(find(checked.cfg.mode).writes, checked.cfg.source)  # as the point's entry will
                if checked.cfg.mode != "run" or not checked.cfg.out_dir:
                    continue  # each identity has its own runs/<dataset>-<key>
                _, ident, out = checked.where()
            except InputError as exc:
                print(f"error: sweep point {' '.join(point)}: {exc} (refused; the other points run)", file=sys.stderr)
                REFUSED[_point_key(p.overrides)] = str(exc)
                continue
            placed.append((" ".join(point) or "(no overrides)", out, ident.key))
        shared = shared_run_dir(placed)
        if shared:
            return str(shared)
    except HydraException as exc:  # an unknown key or option: the closest real one, never Hydra's `+key` advice
        return override_error_line(exc, args.overrides, name) + _at(point)
    except Exception as exc:  # Hydra trips over some malformed overrides (e.g. `narrator=[1]`)
        return f"config override{_at(point)}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _at(point: Sequence[str]) -> str:
    return f" (sweep point {' '.join(point)})" if point else ""


class _BadArgs(Exception):
    """Hydra's own options (argparse) refused: the message is argparse's, without its usage text."""


# A local sweep's points, in order: (job number, overrides, exit code).
SWEEP: list[tuple[int, str, int]] = []
# The basic launcher's points refused by the up-front check (by `_point_key`): the line that named them.
REFUSED: dict[tuple[str, ...], str] = {}
# A local sweep's points in job order (their overrides), as expanded before the first starts.
PLANNED: list[tuple[str, ...]] = []


def _point_key(overrides: Sequence[str]) -> tuple[str, ...]:
    """A point's overrides as values, so that the check's `progress=false` is its job's `progress=False`."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return tuple(sorted(f"{o.key_or_group}@{o.package}={o.value()!r}" for o in parsed))


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command line (default: this process's) and returns its exit code.

    Every way out is a code: a bad override (one line, EXIT_BAD_INPUT), a mode's own code, a
    local sweep with failed points (EXIT_SWEEP_FAILED), Ctrl-C outside a run's own handler.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    SWEEP.clear()
    REFUSED.clear()
    PLANNED.clear()
    try:
        problem = check_overrides(args)
        if problem:
            print(f"error: {bounded(problem)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        saved, sys.argv = sys.argv, [sys.argv[0] if sys.argv else "run.py", *args]  # Hydra reads sys.argv
        try:
            _hydra_task()
        except SystemExit as exc:
            if exc.code:
                return exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.argv = saved
        summary = sweep_summary()
        if summary:
            print(f"error: {summary}", file=sys.stderr)
            return EXIT_SWEEP_FAILED
        return 0
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return EXIT_SIGINT


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_task(cfg: DictConfig) -> None:
    from ncp_local.modes import main as mode_main  # every mode (scipy, matplotlib): after the override check

    job = _local_sweep_job()
    refused = REFUSED.get(_point_key(HydraConfig.get().overrides.task)) if job is not None else None
    if job is not None and refused is None:
        _index_point(cfg, job[0], None)  # its row (running, its run directory) before it plays
    # A point refused up front was named then, in its one line; running it would only say it again.
    code = EXIT_BAD_INPUT if refused is not None else mode_main(cfg)
    if job is None or code in STOPPED_BY_SIGNAL:
        # A single run, a Slurm task (its own exit code), or a stop asked for: exit now.
        if code:
            sys.exit(code)
        return
    # A local sweep goes on past a failed point (each resumes when the sweep is re-run).
    SWEEP.append((*job, code))
    _index_point(cfg, job[0], code, refused or "")


def _index_point(cfg: DictConfig, num: int, code: int | None, error: str = "") -> None:
    """The sweep folder's index.json row of this point (job, overrides, run directory, status, exit code;
    None: it starts), with a waiting row for each point not played yet."""
    from ncp_local.launch.point_index import record_point  # beside the batched launcher (matplotlib)

    hc = HydraConfig.get()
    record_point(Path(str(hc.sweep.dir)), num, list(hc.overrides.task), code, cfg, error, PLANNED)


def _local_sweep_job() -> tuple[int, str] | None:
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN or not str(hc.launcher.get("_target_", "")).endswith("BasicLauncher"):
        return None
    return int(hc.job.num), " ".join(hc.overrides.task)


def sweep_summary() -> str | None:
    """One line when some points of a local sweep failed."""
    failed = [(num, task, code) for num, task, code in SWEEP if code]
    if not failed:
        return None
    which = ", ".join(f"#{num} (exit {code})" for num, _, code in failed)  # Hydra printed each #N's overrides
    advice = "fix the refused point(s), then " if any(code == EXIT_BAD_INPUT for *_, code in failed) else ""
    return (
        f"sweep: {len(failed)} of {len(SWEEP)} point(s) failed: {which}; {advice}re-run the same command "
        "to resume (finished points are not run again)"
    )
