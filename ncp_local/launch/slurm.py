"""Talking to Slurm for the submitter (launch/submit.py): the sbatch command of an array job, the
submission's record in the run directory, which array tasks are still queued, and what the job
scripts in `slurm/` are told instead of repeating it (exit codes).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..exits import EXIT_BAD_INPUT, EXIT_DISK_FULL, EXIT_ENGINE_DEAD, EXIT_FAILED, EXIT_OK, EXIT_SIGNAL
from ..resources import INSTALLED, ROOT, SLURM_DIR
from ..rundir.atomic import DiskFull, atomic_write
from ..rundir.heartbeat import Damaged
from ..rundir.slurm import from_squeue, read_submit

ARRAY_SCRIPT = SLURM_DIR / "ncp_array.sbatch"
SERVE_SCRIPT = SLURM_DIR / "serve.sbatch"
# What the tasks run after their python: the clone's run.py (it puts the clone first on the path, whatever
# the python), or the installed package (a wheel has no run.py). The job script gets run.py's path, or
# nothing for the package (NCP_RUN empty: `python -m ncp_local`).
RUN_ARGS: tuple[str, ...] = ("-m", "ncp_local") if INSTALLED else (str(ROOT / "run.py"),)
NCP_RUN = "" if INSTALLED else RUN_ARGS[0]


def run_command(python: str) -> str:
    """The command line that runs the rig with `python` (for the merge lines the submitter prints)."""
    return shlex.join([python, *RUN_ARGS])


class SubmitError(RuntimeError):
    """A submission refused before anything is queued: one line, exit 2."""


def script_env() -> dict[str, str]:
    """The exit codes the job scripts end with (slurm/*.sbatch), from exits.py: passed in, not repeated."""
    return {"NCP_EXIT_ENGINE_DEAD": str(EXIT_ENGINE_DEAD), "NCP_EXIT_SIGTERM": str(EXIT_SIGNAL["SIGTERM"])}


def read_state(path: Path) -> dict[str, Any]:
    """submit.json as written by an earlier submission ({} when there is none); a damaged one is refused."""
    rec = read_submit(path.parent)
    if rec is None:
        return {}
    if isinstance(rec, Damaged):
        what = "cannot read it" if rec.why.startswith(("not JSON", "unreadable", "larger")) else "not a submit record"
        raise SubmitError(
            f"{path}: {what} ({rec.why}); move it aside (queued jobs it recorded are then not known here)"
        )
    return rec.model_dump(mode="json")


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


def queued_tasks(job_ids: list[str]) -> set[int]:
    """Array task indices of these jobs still pending or running (squeue)."""
    if not job_ids:
        return set()
    said = from_squeue(job_ids)
    if said.unknown:
        raise SubmitError(
            f"{said.unknown[0]}, so the shards already queued are unknown: run this where Slurm's commands "
            "answer (a login node)"
        )
    return {task for _, task in said.tasks}


def sbatch_command(
    args: argparse.Namespace, todo: list[int], name: str, log_dir: Path, task_args: list[str]
) -> list[str]:
    """The sbatch call for array tasks `todo`, the job script and its run.py arguments."""
    array = compress(todo) + (f"%{args.parallel}" if args.parallel else "")
    cmd = [
        "sbatch",
        "--parsable",
        f"--array={array}",
        f"--job-name={name}"[:64],
        f"--output={log_dir / '%A_%a.out'}",
        f"--chdir={Path.cwd()}",
        f"--export=ALL,NCP_PYTHON={args.python},NCP_RUN={NCP_RUN},"
        + ",".join(f"{k}={v}" for k, v in script_env().items()),
    ]
    for flag, value in (
        ("--partition", args.partition),
        ("--account", args.account),
        ("--time", args.time),
        ("--cpus-per-task", args.cpus),
        ("--mem", args.mem),
    ):
        if value is not None:
            cmd.append(f"{flag}={value}")
    if args.gpus:
        cmd.append(f"--gres=gpu:{args.gpus}")
    # Without a terminal the progress is one plain line every progress_every_s: what a task log wants.
    return [*cmd, *args.sbatch, str(ARRAY_SCRIPT), *task_args]


def queue(
    cmd: list[str], log_dir: Path, todo: list[int], jobs: list[dict[str, Any]], state_path: Path, record: dict[str, Any]
) -> tuple[str | None, int]:
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
    jobs.append(
        {"job": job, "tasks": todo, "submitted": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "command": cmd}
    )
    try:
        atomic_write(state_path, json.dumps({**record, "jobs": jobs}, indent=2))
    except (OSError, DiskFull) as exc:
        print(
            f"error: submitted job {job}, but {state_path} was not written ({exc}): a re-submission would not "
            f"know it; cancel it (scancel {job}) or wait for it before re-submitting",
            file=sys.stderr,
        )
        return None, EXIT_DISK_FULL
    return job, EXIT_OK
