"""A server that answers /health and its model list but stops answering requests (issue 60 item 5): the
rig's client gives up after its limit (the request timeout, `endpoint.timeout_s`, tried 1 + max_retries
times) and the run ends with the engine-dead exit, resumable; it never hangs. And the server job's
graceful stop: `vllm serve` gets `--shutdown-timeout` where the installed vLLM has it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from ncp_local.engines.serve import DRAIN_S, SHUTDOWN_FLAG, graceful_shutdown, serve_args
from ncp_local.engines.settings import ModelSettings
from ncp_local.exits import EXIT_ENGINE_DEAD

pytest.importorskip("openai", reason="openai is not installed (pip install -e '.[openai]')")

SERVED = "served-m"


class _Stuck(BaseHTTPRequestHandler):
    """Healthy, lists its model, takes every completion request and never answers it."""

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            return self._send({})
        if self.path == "/v1/models":
            return self._send({"object": "list", "data": [{"id": SERVED, "object": "model", "max_model_len": 8192}]})
        if self.path == "/version":
            return self._send({"version": "0.0-stuck"})
        self.send_response(404)
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        self.server.posts += 1  # type: ignore[attr-defined]
        if self.server.stopping:  # type: ignore[attr-defined]
            # What vLLM 0.32 answered a new request while draining under --shutdown-timeout (measured).
            data = json.dumps({"error": {"message": "cannot schedule new futures after shutdown"}}).encode()
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.server.release.wait(60)  # type: ignore[attr-defined]  # held open, never answered

    def _send(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stuck() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stuck)
    server.daemon_threads = True
    server.posts = 0  # type: ignore[attr-defined]
    server.stopping = False  # type: ignore[attr-defined]
    server.release = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


def _endpoint(server: Any) -> list[str]:
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    return [
        o
        for role in ("narrator", "player", "auditor")
        for o in (
            f"{role}.engine=openai",
            f"{role}.endpoint.base_url={url}",
            f"{role}.endpoint.model={SERVED}",
            f"{role}.endpoint.timeout_s=0.5",
            f"{role}.endpoint.max_retries=1",
            f"{role}.endpoint.backoff_s=0.1",
        )
    ]


def test_a_run_on_a_server_that_stops_answering_ends_engine_dead_after_its_limit(stuck: Any, tmp_path: Path) -> None:
    started = time.monotonic()
    run = run_cli("limit=1", "max_turns=2", "progress=false", f"out_dir={tmp_path / 'run'}", *_endpoint(stuck))
    took = time.monotonic() - started
    assert run.returncode == EXIT_ENGINE_DEAD, run.stderr
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("error: ")]
    assert "unreachable after 2 tries" in line and "APITimeoutError" in line, line
    assert line.endswith("re-run the same command to resume"), line
    # Two tries of 0.5 s and a 0.1 s backoff, well inside a bound (the run's own start included).
    assert took < 60 and stuck.posts >= 2
    assert not list((tmp_path / "run" / "results").glob("*.json"))  # nothing written as if it had ended


def test_a_server_refusing_requests_while_it_stops_ends_the_run_engine_dead(stuck: Any, tmp_path: Path) -> None:
    """Measured on a real vllm serve (docs/measurements/2026-12-05-runs-in-flight.md): while it drains, new
    requests get HTTP 500 "cannot schedule new futures after shutdown"; taken for a failed attempt, the
    episode ended `invalid` and the run exit 0 with results an uninterrupted run does not give."""
    stuck.stopping = True
    run = run_cli("limit=1", "max_turns=2", "progress=false", f"out_dir={tmp_path / 'run'}", *_endpoint(stuck))
    assert run.returncode == EXIT_ENGINE_DEAD, run.stderr
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("error: ")]
    assert "is stopping after 2 tries: HTTP 500" in line and line.endswith("re-run the same command to resume")
    assert not list((tmp_path / "run" / "results").glob("*.json"))  # no episode ended `invalid` by it


MODEL = ModelSettings(name="m", path="/m")


def test_the_server_gets_the_graceful_stop_where_the_installed_vllm_has_it() -> None:
    has = graceful_shutdown()
    args = serve_args(MODEL, "/m", drain_s=DRAIN_S if has else None)
    assert (args[-2:] == [SHUTDOWN_FLAG, str(DRAIN_S)]) is has
    assert SHUTDOWN_FLAG not in serve_args(MODEL, "/m")


def test_graceful_stop_is_read_from_the_vllm_source(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "arg_utils.py").write_text(
        'parser.add_argument(\n    "--shutdown-timeout",\n    type=int)\n'
    )
    assert graceful_shutdown(tmp_path)
    (tmp_path / "engine" / "arg_utils.py").write_text('parser.add_argument("--disable-log-stats")\n')
    assert not graceful_shutdown(tmp_path)
    assert not graceful_shutdown(tmp_path / "absent")
