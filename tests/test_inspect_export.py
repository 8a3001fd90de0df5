"""`mode=export export.format=inspect`: a run as an Inspect `.eval` log, read back with inspect_ai's
own reader, and opened in Inspect's real viewer (`inspect view`) in headless Chromium.

The run is scripted (tests/test_report.py's: a conflict, an invalid episode with failed attempts,
all_resolved, max_turns), so no model ran: the log must say `scripted/no-model`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from helpers import headless_chromium
from ncp_local.protocol.metrics import episode_metrics
from ncp_local.report.inspect_log import conflict_label
from ncp_local.report.runs import load_run
from ncp_local.rundir.call_log import read_calls
from test_report import make_run, write_dataset

inspect_log = pytest.importorskip("inspect_ai.log", reason="inspect_ai is not installed (the `inspect` extra)")
ROOT = Path(__file__).resolve().parent.parent
SHOT = Path("/tmp/inspect_view.png")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("inspect")
    run_dir = make_run(base / "run", write_dataset(base / "dataset"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["config"].update(
        engine={"name": "scripted"},
        seed=0,
        limit=None,
        player={"model": {"name": "smollm2-135m-instruct"}, "temperature": 0.6},
    )
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    # Through the mode, as a user runs it (in-process: run.py's own dispatch).
    res = run_cli("mode=export", f"runs=[{run_dir}]", f"export.out={base / 'logs'}", cwd=base)
    assert res.returncode == 0, res.stderr[-2000:]
    [log] = sorted((base / "logs").glob("*.eval"))
    assert str(log) in res.stdout and "inspect view --log-dir" in res.stdout
    return run_dir, log


def test_log_reads_back_as_the_run(exported: tuple[Path, Path]) -> None:
    run_dir, path = exported
    log = inspect_log.read_eval_log(str(path))
    run = load_run(run_dir)
    calls = read_calls(run_dir / "calls.jsonl")

    assert log.status == "success" and log.eval.task == "ncp"
    assert log.eval.dataset.sample_ids == list(run.results) == ["a", "b", "c", "d", "e"]
    # No model ran: every role says so, whatever the config's model names.
    assert {r: m.model for r, m in log.eval.model_roles.items()} == {
        "narrator": "scripted/no-model",
        "player": "scripted/no-model",
        "auditor": "scripted/no-model",
    }
    assert log.eval.model_roles["player"].config.temperature == 0.6

    # One sample per episode; its scores are the record's values.
    assert [s.id for s in log.samples] == list(run.results)
    for sample in log.samples:
        result = run.results[sample.id]
        m = episode_metrics(result)
        assert {k: v.value for k, v in sample.scores.items()} == {
            "termination": m.termination,
            "turns": m.turns,
            "trajectory": m.trajectory_progress,
            "satisfied": m.satisfied,
            "conflict": conflict_label(m),
        }
        # The transcript: opening, then each turn's player input and narration.
        assert [(x.role, x.text) for x in sample.messages] == [("assistant", result.opening)] + [
            pair for t in result.turns for pair in (("user", t.player_input), ("assistant", t.response))
        ]

        # The model events are the call log's lines for this episode, in order, with role and stage.
        mine = [c for c in calls if c.spec_id == sample.id]
        events = [e for e in sample.events if e.event == "model"]
        assert len(events) == len(mine) > 0
        for e, c in zip(events, mine, strict=True):
            assert (e.role, e.metadata["stage"], e.metadata["turn_id"], e.metadata["attempt"], e.metadata["seed"]) == (
                c.role,
                c.stage,
                c.turn,
                c.attempt,
                c.seed,
            )
            u = e.output.usage
            assert (u.input_tokens + u.input_tokens_cache_read, u.input_tokens_cache_read, u.output_tokens) == (
                c.prompt_tokens,
                c.cached_tokens,
                c.generated_tokens,
            )
            assert e.error == c.error
            if c.error:
                assert e.output.completion == c.output  # a failed attempt's raw text
        # Token usage per model and per role is the log summed.
        usage = sample.model_usage["scripted/no-model"]
        assert usage.input_tokens + usage.input_tokens_cache_read == sum(c.prompt_tokens for c in mine)
        assert usage.output_tokens == sum(c.generated_tokens for c in mine)
        assert set(sample.role_usage) == {c.role for c in mine}

    by_id = {s.id: s for s in log.samples}
    assert (
        by_id["a"].scores["conflict"].value == "fact"
        and by_id["d"].scores["conflict"].value == "commitment, player_input"
    )
    failed = [e for e in by_id["e"].events if e.event == "model" and e.error]
    assert [e.metadata["stage"] for e in failed] == ["narrate"] * 3 and failed[0].output.completion == "not json"
    # The accepted narration of a turn is the record's text.
    narrate = next(e for e in by_id["b"].events if e.event == "model" and e.metadata["stage"] == "narrate")
    assert narrate.output.completion == run.results["b"].turns[0].response
    assert log.stats.model_usage["scripted/no-model"].output_tokens == sum(c.generated_tokens for c in calls)
    # Results: the rig's own averages over scored episodes (invalid left out).
    turns = next(s for s in log.results.scores if s.name == "turns")
    assert turns.metrics["mean"].value == pytest.approx((2 + 4 + 3 + 1) / 4)
    term = next(s for s in log.results.scores if s.name == "termination")
    assert {k: m.value for k, m in term.metrics.items() if m.value} == {
        "conflict": 2,
        "max_turns": 1,
        "all_resolved": 1,
        "invalid": 1,
    }


def test_events_can_be_left_out(exported: tuple[Path, Path], tmp_path: Path) -> None:
    """export.events=false: no per-call event, the same transcript, scores and token usage, a smaller file."""
    run_dir, full_path = exported
    res = run_cli("mode=export", f"runs=[{run_dir}]", "export.events=false", f"export.out={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    [path] = sorted(tmp_path.glob("*.eval"))
    full, lean = inspect_log.read_eval_log(str(full_path)), inspect_log.read_eval_log(str(path))
    assert all(s.events == [] for s in lean.samples) and any(s.events for s in full.samples)
    for a, b in zip(full.samples, lean.samples, strict=True):
        assert [m.text for m in a.messages] == [m.text for m in b.messages]
        assert {k: v.value for k, v in a.scores.items()} == {k: v.value for k, v in b.scores.items()}
        assert a.model_usage == b.model_usage and a.role_usage == b.role_usage
    assert lean.results == full.results and path.stat().st_size < full_path.stat().st_size


def test_unknown_format_is_one_line(tmp_path: Path) -> None:
    # `export.format` accepts only formats the rig writes.
    res = run_cli("mode=export", "runs=[x]", "export.format=csv", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: config: export.format:"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


# ---- the real viewer ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{url}: the process exited ({proc.returncode})"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {seconds} s")


class Page:
    """One Chromium tab over the DevTools protocol: headless `--dump-dom` stops before the viewer's
    own requests finish, so the test waits in real time for what it asserts."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.n = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg.get("result", {})

    def text(self) -> str:
        got = self.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''")
        return str(got["result"].get("value", ""))

    def wait_for(self, needles: tuple[str, ...], seconds: float) -> str:
        deadline = time.monotonic() + seconds
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(n in text for n in needles):
                return text
            time.sleep(0.5)
        raise AssertionError(f"not shown within {seconds} s: {needles}; page text: {text[:1500]!r}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)


@pytest.mark.timeout(300)
def test_inspect_view_opens_the_log(chromium: Path, exported: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("websockets.sync.client", reason="websockets (a uvicorn extra) is not installed")
    inspect = shutil.which("inspect", path=str(Path(sys.executable).parent)) or "inspect"
    run_dir, log = exported
    port, devtools = _free_port(), _free_port()
    view = subprocess.Popen(
        [inspect, "view", "--log-dir", str(log.parent), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    browser = None
    try:
        _wait_http(f"http://127.0.0.1:{port}/", view, 120)
        browser = subprocess.Popen(
            headless_chromium(
                chromium,
                tmp_path / "profile",
                "--window-size=1400,1000",
                f"--remote-debugging-port={devtools}",
                "about:blank",
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait_http(f"http://127.0.0.1:{devtools}/json/version", browser, 60)
        with urllib.request.urlopen(f"http://127.0.0.1:{devtools}/json/list", timeout=10) as r:
            tab = next(t for t in json.load(r) if t.get("type") == "page")
        from websockets.sync.client import connect

        with connect(tab["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            page = Page(ws)
            page.call("Page.enable")
            # The log's own page in the viewer: the task, the role models, one row per episode with its scores.
            page.call("Page.navigate", url=f"http://127.0.0.1:{port}/#/logs/{log.name}")
            page.wait_for(("ncp", "scripted/no-model", "Story a; the player is a visitor"), 120)
            page.wait_for(("max_turns", "all_resolved", "invalid", "5 Samples"), 60)
            shot = base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
            # An episode's own page: its transcript (the record's opening and player input) and its model calls.
            a = load_run(run_dir).results["a"]
            page.call("Page.navigate", url=f"http://127.0.0.1:{port}/#/logs/{log.name}/samples/sample/a/1")
            text = page.wait_for((a.opening, a.turns[0].player_input, "Story a; the player is a visitor"), 120)
            assert text.upper().count("MODEL CALL (NARRATOR)") >= 2 and "MODEL CALL (AUDITOR)" in text.upper()
        SHOT.write_bytes(shot)
        assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
    finally:
        if browser is not None:
            _stop(browser)
        _stop(view)
    assert view.poll() is not None and (browser is None or browser.poll() is not None)
