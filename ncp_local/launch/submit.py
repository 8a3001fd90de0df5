"""Submit one run as a Slurm array job: task i of N runs shard i.

    python slurm/submit.py --shards N [sbatch options] -- <hydra overrides>

The run directory is computed here, once, from the overrides (the same
`runs/<dataset>-<config hash>` a local run would use, or the `out_dir` you
give), and every task gets `shard.count=N out_dir=<that directory>`. Config,
dataset and model paths are checked before anything is submitted.

Submitting the same command again submits only the shards that are not
finished (no `DONE` marker with all their results) and not already queued or
running, so it both resumes a run and is safe to repeat. Then:

    python run.py mode=merge out_dir=<run directory>

With `--serve ROLE` the role's model is served by `vllm serve` in a job of its own
(slurm/serve.sbatch: tensor parallel inside a node; across nodes pipeline parallel by vLLM's own
multi-node mode, or over a Ray cluster, or vLLM's data parallel), the array depends on that job's
start and its tasks reach the server through an endpoint file in the run directory
(`ROLE.endpoint.file`, waited for, bounded), and a last job cancels the server when the array has
ended (unless `--keep-server`). With a sweep (`-m`) the one server serves the role for every point
(the role's model must be the same in each).

Exit codes: 0 submitted (or nothing to do), 2 bad input (options, config,
a garbled submit.json, no sbatch/squeue on PATH), 1 sbatch failed, 4 the job
was submitted but submit.json could not be written (disk full, I/O error).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from hydra.errors import HydraException

from .. import config as config_mod
from .. import plan
from ..config import RunConfig
from ..config.suggest import argparse_line
from ..errors import InputError
from ..execution import points
from ..execution.failures import exit_for
from ..exits import EXIT_BAD_INPUT
from ..modes import find
from ..resources import engine_install_hint
from ..rundir import layout
from ..rundir.identity import digest
from .slurm import SubmitError, compress, queue, queued_tasks, read_state, run_command, sbatch_command

RESERVED = ("shard.count", "shard.index", "mode")
SWEEP_FLAGS = ("-m", "--multirun")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line (argparse prints the whole usage first), exit 2 as argparse does; a misspelt
        # option or choice with the closest real one, as run.py says it (config/suggest.py).
        print(f"error: {argparse_line(message, self._option_string_actions)} (see --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _served() -> ModuleType:
    """launch/served.py, imported when `--serve` asks for it: it builds the server's engine arguments with the
    engines' own modules (psutil among their imports, the engine extra's), which a submission that serves
    nothing never needs: an installed package without the engines still submits and dry-runs."""
    try:
        import ncp_local.launch.served as served
    except ImportError as exc:
        raise SubmitError(
            f"--serve: needs the engine's packages ({exc.name} is not installed): {engine_install_hint()}"
        ) from None
    return served


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        argv, overrides = argv[:cut], argv[cut + 1 :]
    else:
        overrides = []
    # No abbreviations: `--shard 2` is a misspelling to name, not `--shards 2` taken silently.
    p = _Parser(prog="slurm/submit.py", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    # Required, but checked after the options are read: a misspelt `--shardz` is named as such first.
    p.add_argument("--shards", type=int, help="array tasks (shards) N, required; keep it for re-submissions")
    p.add_argument("--parallel", type=int, help="at most this many tasks at once (--array=...%%K)")
    p.add_argument("--partition", help="sbatch --partition")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument("--time", help="sbatch --time (default: the template's 24:00:00)")
    p.add_argument("--gpus", type=int, help="GPUs per task (sbatch --gres=gpu:G)")
    p.add_argument("--cpus", type=int, help="sbatch --cpus-per-task")
    p.add_argument("--mem", help="sbatch --mem, e.g. 64G")
    p.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="ARG",
        help="any other sbatch option, e.g. --sbatch=--qos=high (repeatable)",
    )
    p.add_argument("--python", default=sys.executable, help="python for the tasks (default: this one)")
    p.add_argument(
        "--skip-model-check",
        action="store_true",
        help="do not check model paths here (they exist only on the compute nodes)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the sbatch command, submit nothing")
    p.add_argument(
        "--serve",
        choices=("narrator", "player", "auditor"),
        help="serve this role's model with vllm serve in a job of its own, shared by every task",
    )
    p.add_argument("--serve-nodes", type=int, default=1, help="nodes for the served model (default 1)")
    p.add_argument(
        "--serve-gpus",
        type=int,
        help="GPUs per node for it: its tensor parallel size (default: the model file's tensor_parallel_size)",
    )
    p.add_argument(
        "--serve-across",
        choices=("pipeline", "ray", "data"),
        default="pipeline",
        help="with several nodes: pipeline parallel by vLLM's own multi-node mode (run on the CPU build), the "
        "same over a Ray cluster (never run), or vLLM's data parallel",
    )
    p.add_argument("--serve-port", type=int, default=8000)
    p.add_argument(
        "--serve-master-port", type=int, default=29501, help="torch.distributed's port on the first node (pipeline)"
    )
    p.add_argument("--serve-time", help="sbatch --time of the server job")
    p.add_argument(
        "--keep-server",
        action="store_true",
        help="leave the server running when the array ends (shared by several sweeps; scancel it yourself)",
    )
    args, unknown = p.parse_known_args(argv)
    if unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.shards is None:
        p.error("the following arguments are required: --shards")
    for flag, value, least in (
        ("--shards", args.shards, 1),
        ("--parallel", args.parallel, 1),
        ("--gpus", args.gpus, 0),
        ("--cpus", args.cpus, 1),
    ):
        if value is not None and value < least:
            p.error(f"{flag} must be at least {least} (got {value})")
    return args, overrides


class Resolved(NamedTuple):
    """A run as the submitter resolved it."""

    root: Path  # its run directory
    identity: str
    specs: list[str]  # spec ids
    trials: int  # trials per spec
    # Whether the memory plan was checked here: not when the tasks ask for GPUs this machine cannot
    # describe (none here and no plan.gpus); each task plans on its own GPUs at its start.
    planned: bool


def plans_here(cfg: RunConfig, task_gpus: int | None) -> bool:
    """Whether this machine's plan is the tasks' plan: their GPUs are named (plan.gpus) or seen here, or
    they ask for none. A login node without GPUs would plan a GPU task in its own RAM, and refuse
    (or pass) for the wrong hardware."""
    return not task_gpus or cfg.plan.gpus is not None or plan.inventory(None).kind == "gpu"


def resolve_run(
    overrides: list[str], check_models: bool, endpoints: bool = True, task_gpus: int | None = None
) -> Resolved:
    """The run these overrides make, checked as its tasks would check it at their start (`task_gpus`: the
    GPUs each task asks for); fails like run.py would."""
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key == "mode":
            find(o.split("=", 1)[-1])  # a misspelt mode named as run.py names it
        if key in RESERVED:
            raise SubmitError(f"override {o}: {key} is set by submit.py (use --shards)")
    try:
        raw = points.load(overrides)
    except HydraException as exc:
        raise SubmitError(config_mod.override_error_line(exc, overrides)) from None
    except InputError:
        raise
    except Exception as exc:  # Hydra's other refusals are the config's too
        raise SubmitError(f"config: {exc}".splitlines()[0]) from None
    cfg = config_mod.validate(raw)
    if cfg.mode != "run":
        raise SubmitError(f"mode: only mode=run is submitted (got {cfg.mode!r})")
    # What each task would refuse at its start (models: unless they live on the compute nodes only).
    planned = check_models and plans_here(cfg, task_gpus)
    checked = points.check(raw, models=check_models, endpoints=endpoints, memory_plan=planned)
    specs, ident, root = checked.where()
    return Resolved((Path.cwd() / root).resolve(), ident.key, [s.id for s in specs], cfg.trials.count, planned)


PLAN_ELSEWHERE = (
    "plan: not checked here: the tasks ask for GPUs (--gpus {gpus}) and this machine has none and no plan.gpus; "
    "each task plans on its own GPUs at its start (to check now: plan.gpus=[<count>x<kind>], e.g. [1xH100-80GB])"
)


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """Each point's overrides."""
    try:
        grid = points.expand(overrides)
        for _, why in grid.unexpanded:
            raise why
    except HydraException as exc:
        raise SubmitError(config_mod.override_error_line(exc, overrides)) from None
    except Exception as exc:  # glob() sweeps need Hydra's own config loader
        raise SubmitError(
            f"sweep: cannot expand it here ({type(exc).__name__}: {str(exc)[:120]}); list the values instead (a,b,c)"
        ) from None
    return [list(p.overrides) for p in grid.points()]


def resolve_sweep(
    overrides: list[str], check_models: bool, served: Sequence[str] = (), task_gpus: int | None = None
) -> list[tuple[list[str], Resolved]]:
    """(point overrides, run directory, identity, spec ids, trials per spec) per point of the sweep, each checked as
    `resolve_run` checks a single run; the first bad point refuses the submission (nothing is queued).
    `served`: the overrides sending a role to the sweep's server (its endpoint is not asked here)."""
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in RESERVED + ("out_dir",):
            raise SubmitError(
                f"override {o}: in a sweep, {key} is set per point (each point has its own run "
                "directory; use --shards for the split)"
            )
        if key == "hydra/launcher" and o.split("=", 1)[1] != "batched":
            raise SubmitError(f"override {o}: a sweep is submitted with hydra/launcher=batched (one array job)")
    out = []
    for point in sweep_points(overrides):
        try:
            resolved = resolve_run([*point, *served], check_models, endpoints=not served, task_gpus=task_gpus)
        except (SubmitError, InputError) as exc:
            raise SubmitError(f"sweep point {' '.join(point)}: {exc}") from None
        out.append((point, resolved))
    roots = [r.root for _, r in out]
    if len(set(roots)) < len(roots):
        same = next(r for r in roots if roots.count(r) > 1)
        raise SubmitError(
            f"sweep: two points share the run directory {same} (they differ only in settings that "
            "do not change results, e.g. limit or concurrency): drop one"
        )
    return out


def main(argv: list[str]) -> int:
    args, overrides = parse_args(argv)
    flags = [o for o in overrides if o.startswith("-") and o not in SWEEP_FLAGS]
    if flags:  # after `--` only the overrides and -m: a misspelt -m (or a submit option put late)
        words = " ".join(flags)
        return refused(SubmitError(argparse_line(f"after --: unrecognized arguments: {words}", SWEEP_FLAGS)))
    if any(o in SWEEP_FLAGS for o in overrides):
        return main_sweep(args, [o for o in overrides if o not in SWEEP_FLAGS])
    n = args.shards
    try:
        serving = None
        if args.serve:
            serving = _served().served_role(args, [overrides])
            overrides = [*overrides, *serving["overrides"]]
        resolved = resolve_run(
            overrides, check_models=not args.skip_model_check, endpoints=not serving, task_gpus=args.gpus
        )
        root, ident, specs, trials, _ = resolved
        if n > len(specs):
            raise SubmitError(f"--shards {n}: more shards than the run's {len(specs)} spec(s)")
        state_path = root / layout.SUBMIT_STATE
        state = read_state(state_path)
        if state and state.get("identity") != ident:
            raise SubmitError(
                f"{state_path}: identity: this directory holds a run of another config "
                f"({state.get('identity')} != {ident}); use another out_dir"
            )
        if state and state.get("shards") != n:
            raise SubmitError(
                f"{state_path}: shards: this run was split into {state.get('shards')} shards; "
                f"re-submit with --shards {state.get('shards')}"
            )
        other = sorted(c for c in layout.shard_dirs(root) if c != n)
        if other:
            raise SubmitError(f"{root}: holds shards of another layout (of-{other[0]:03d}); use another out_dir")
        jobs: list[dict[str, Any]] = state.get("jobs", [])
        done = [i for i in range(n) if layout.shard_finished(root, i, n, specs, trials)]
        busy = queued_tasks([j["job"] for j in jobs]) - set(done)
        if not args.dry_run and shutil.which("sbatch") is None:
            raise SubmitError(
                "sbatch: not found on PATH: submit from a Slurm login node (--dry-run prints the command without it)"
            )
    except (SubmitError, InputError) as exc:  # InputError: a bad spec, config field or model path
        return refused(exc)

    merge_cmd = f"{run_command(args.python)} mode=merge out_dir={shlex.quote(str(root))}"
    todo = [i for i in range(n) if i not in done and i not in busy]
    print(f"run directory: {root}")
    if not resolved.planned and not args.skip_model_check:
        print(PLAN_ELSEWHERE.format(gpus=args.gpus))
    print(f"shards: {n} ({len(specs)} specs); done {len(done)}, queued or running {len(busy)}, to submit {len(todo)}")
    if not todo:
        if len(done) == n:
            print(f"all {n} shards are done; merge with:\n  {merge_cmd}")
        else:
            print(f"nothing to submit; watch with: squeue -r -j {','.join(j['job'] for j in jobs)}")
        return 0

    cmd = sbatch_command(
        args, todo, f"ncp-{root.name}", root / layout.SLURM_LOGS, [*overrides, f"shard.count={n}", f"out_dir={root}"]
    )
    if serving is not None:
        endpoint = layout.endpoint_file(root, serving["role"])
        cmd = sbatch_command(
            args,
            todo,
            f"ncp-{root.name}",
            root / layout.SLURM_LOGS,
            [*overrides, f"{serving['role']}.endpoint.file={endpoint}", f"shard.count={n}", f"out_dir={root}"],
        )
        return _served().submit_served(
            args,
            serving,
            root,
            endpoint,
            cmd,
            todo,
            jobs,
            state_path,
            {"identity": ident, "shards": n, "specs": len(specs), "overrides": overrides},
        )
    if args.dry_run:
        print(shlex.join(cmd))
        return 0

    job, rc = queue(
        cmd,
        root / layout.SLURM_LOGS,
        todo,
        jobs,
        state_path,
        {"identity": ident, "shards": n, "specs": len(specs), "overrides": overrides},
    )
    if job is None:
        return rc
    print(f"submitted job {job}: task(s) {compress(todo)} of {n}")
    print(f"logs:  {root / layout.SLURM_LOGS}/{job}_<task>.out")
    print(f"watch: squeue -r -j {job}   (sacct -j {job} where accounting is on)")
    print(f"merge: {merge_cmd}")
    return 0


def main_sweep(args: argparse.Namespace, overrides: list[str]) -> int:
    """`submit.py --shards N -- -m key=a,b ...`: one array job; task k runs shard k of every point's specs in one
    process (hydra/launcher=batched), so each task loads each model once. With `--serve ROLE` every point
    sends ROLE's calls to the one server job (the role's model must be the same in every point)."""
    n = args.shards
    serving = None
    try:
        if args.serve:
            serving = _served().served_role(
                args, sweep_points([o for o in overrides if o.split("=", 1)[0] != "hydra/launcher"])
            )
        resolved = resolve_sweep(
            overrides,
            check_models=not args.skip_model_check,
            served=serving["overrides"] if serving else [],
            task_gpus=args.gpus,
        )
        least = min(len(r.specs) for _, r in resolved)
        if n > least:
            raise SubmitError(f"--shards {n}: more shards than the smallest point's {least} spec(s)")
        ident = digest(sorted(r.identity for _, r in resolved))
        sweep_dir = (Path.cwd() / "multirun" / f"sweep-{ident}").resolve()
        state_path = sweep_dir / layout.SUBMIT_STATE
        state = read_state(state_path)
        if state and state.get("shards") != n:
            raise SubmitError(
                f"{state_path}: shards: this sweep was split into {state.get('shards')} shards; "
                f"re-submit with --shards {state.get('shards')}"
            )
        for _, r in resolved:
            other = sorted(c for c in layout.shard_dirs(r.root) if c != n)
            if other:
                raise SubmitError(
                    f"{r.root}: holds shards of another layout (of-{other[0]:03d}); it belongs to another submission"
                )
        jobs: list[dict[str, Any]] = state.get("jobs", [])
        if serving:
            done = [k for k in range(n) if _served().served_task_done(sweep_dir, k, n, len(resolved))]
        else:
            done = [
                k for k in range(n) if all(layout.shard_finished(r.root, k, n, r.specs, r.trials) for _, r in resolved)
            ]
        busy = queued_tasks([j["job"] for j in jobs]) - set(done)
        if not args.dry_run and shutil.which("sbatch") is None:
            raise SubmitError(
                "sbatch: not found on PATH: submit from a Slurm login node (--dry-run prints the command without it)"
            )
    except (SubmitError, InputError) as exc:
        return refused(exc)

    print(f"sweep folder: {sweep_dir} ({len(resolved)} points, index-shard-*.json per task)")
    for point, r in resolved:
        # A served role's run directories are named by what its server reports (identity), so only the
        # tasks know them: they write them in their index-shard-*.json.
        where = "its run directory in the tasks' index-shard-*.json" if serving else str(r.root)
        print(f"  {' '.join(point)}: {where} ({len(r.specs)} specs)")
    if not args.skip_model_check and not all(r.planned for _, r in resolved):
        print(PLAN_ELSEWHERE.format(gpus=args.gpus))
    todo = [k for k in range(n) if k not in done and k not in busy]
    print(f"shards: {n}; done {len(done)}, queued or running {len(busy)}, to submit {len(todo)}")
    run_py = run_command(args.python)
    if serving:
        merge = [f"{run_py} mode=merge out_dir=<each run_dir in {sweep_dir}/index-shard-*.json>"]
    else:
        merge = [f"{run_py} mode=merge out_dir={shlex.quote(str(r.root))}" for _, r in resolved]
    if not todo:
        if len(done) == n:
            print("all shards of every point are done; merge each point with:\n  " + "\n  ".join(merge))
        else:
            print(f"nothing to submit; watch with: squeue -r -j {','.join(j['job'] for j in jobs)}")
        return 0
    task_overrides = [o for o in overrides if o.split("=", 1)[0] != "hydra/launcher"]
    if serving:
        endpoint = layout.endpoint_file(sweep_dir, serving["role"])
        task_overrides += [*serving["overrides"], f"{serving['role']}.endpoint.file={endpoint}"]
    cmd = sbatch_command(
        args,
        todo,
        f"ncp-sweep-{ident}",
        sweep_dir / layout.SLURM_LOGS,
        ["-m", "hydra/launcher=batched", *task_overrides, f"shard.count={n}", f"hydra.sweep.dir={sweep_dir}"],
    )
    record = {
        "identity": ident,
        "shards": n,
        "overrides": overrides,
        "sweep": [
            {"overrides": p, "run_dir": None if serving else str(r.root), "identity": r.identity} for p, r in resolved
        ],
    }
    if serving:
        return _served().submit_served(args, serving, sweep_dir, endpoint, cmd, todo, jobs, state_path, record)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    job, rc = queue(cmd, sweep_dir / layout.SLURM_LOGS, todo, jobs, state_path, record)
    if job is None:
        return rc
    print(f"submitted job {job}: task(s) {compress(todo)} of {n}, each running shard k of all {len(resolved)} points")
    print(f"logs:  {sweep_dir / layout.SLURM_LOGS}/{job}_<task>.out")
    print(f"watch: squeue -r -j {job}")
    print("merge: (when all are done) " + "; ".join(merge))
    return 0


def refused(exc: Exception) -> int:
    """One error line; a submission refused before anything is queued is bad input (exit 2)."""
    known = exit_for(exc)
    print(f"error: {known.message if known else exc}", file=sys.stderr)
    return known.code if known else EXIT_BAD_INPUT
