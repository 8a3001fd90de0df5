"""A quiet terminal (execution/engine_log.py): what the engine's processes and libraries write goes to
engine.log, at the file-descriptor level (a child process inherits it, as vLLM's engine core does);
the rig's own lines, its `error:` lines included, stay on the terminal; `verbose=true` changes nothing.
Each case runs in a fresh interpreter: the redirection is process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import logging, os, subprocess, sys, warnings
    from pathlib import Path
    from ncp_local.engines.base import EngineDead
    from ncp_local.execution import engine_log
    from ncp_local.execution.failures import exit_for

    log = Path(sys.argv[1])
    verbose = sys.argv[2] == "1"
    library = logging.getLogger("some.library")
    with engine_log.quiet(verbose, "test"):
        print("rig: before the log has its place")
        os.write(1, b"fd1: engine line before the place\\n")
        engine_log.place(log)
        late = logging.getLogger("late.library")  # configured while quiet, on the streams of the moment
        late.addHandler(logging.StreamHandler(sys.stderr))
        engine_log.settle()
        late.warning("late: a library warning")
        library.warning("lastresort: a warning without a handler")
        warnings.warn("warn: a library warning")
        subprocess.run([sys.executable, "-c",
                        "import sys; print('child: stdout'); print('child: stderr', file=sys.stderr)"])
        os.write(2, b"fd2: Traceback: RuntimeError: not enough memory for the KV cache\\n")
        print("rig: the table", flush=True)
        exit_for(EngineDead("model 'm' (vllm): the engine failed to start")).print()
    print("rig: after")
""")

ENGINE_LINES = (
    "fd1: engine line",
    "late: a library",
    "lastresort: a warning",
    "warn: a library",
    "child: stdout",
    "child: stderr",
    "fd2: Traceback",
)


def _run(tmp_path: Path, verbose: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    log = tmp_path / "run" / "engine.log"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log), "1" if verbose else "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "NCP_LOCAL_CACHE": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr
    return proc, log


def test_engine_output_goes_to_the_log_and_the_rigs_lines_to_the_terminal(tmp_path: Path) -> None:
    proc, log = _run(tmp_path, verbose=False)
    terminal = "\n".join(ln for ln in (proc.stdout + proc.stderr).splitlines() if not ln.startswith("  | "))
    for line in ENGINE_LINES:
        assert line not in terminal, line
    text = log.read_text()
    for line in ENGINE_LINES:
        assert line in text, line
    assert text.index("fd1: engine line before the place") < text.index("child: stdout")  # moved, then appended
    assert proc.stdout.splitlines() == ["rig: before the log has its place", "rig: the table", "rig: after"]
    # An engine failure: its one error line, then where the log is and its last relevant lines.
    assert proc.stderr.splitlines() == [
        "error: engine died: model 'm' (vllm): the engine failed to start",
        f"  last lines of {log}:",
        "  | fd2: Traceback: RuntimeError: not enough memory for the KV cache",
    ]
    assert not list((tmp_path / "cache").glob("logs/*"))  # placed: no log left in the cache


def test_verbose_streams_everything_as_before(tmp_path: Path) -> None:
    proc, log = _run(tmp_path, verbose=True)
    terminal = proc.stdout + proc.stderr
    for line in ENGINE_LINES:
        assert line in terminal, line
    assert not log.exists() and "rig: the table" in proc.stdout
