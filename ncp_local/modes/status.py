"""`mode=status runs=[...]`: where every run, shard and sweep point stands, read from its directory.

One row each (rundir/status.py decides the state from the heartbeat, the files and, where it
answers, Slurm), a total row, and nothing written. `status.format=json` prints one JSON document
(docs/reference/status.md); `status.watch=S` redraws every S seconds (in place on a terminal) until
interrupted.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

from ..config import ConfigError, RunConfig
from ..execution.progress import duration
from ..rundir.status import Row, Thresholds, document, status_rows, total

HEAD = ("run", "state", "episodes", "turns", "calls/s", "tok/s", "last turn", "ETA", "")


def _ago(s: float | None) -> str:
    return "-" if s is None else f"{duration(s)} ago"


def _row_cells(r: Row) -> tuple[str, ...]:
    eps = f"{r.episodes_finished}/{r.episodes_total if r.episodes_total is not None else '?'}"
    turns = (
        "-"
        if r.turns_committed is None
        else f"{r.turns_committed}" + (f"/{r.turns_possible}" if r.turns_possible else "")
    )
    rate = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    note = []
    if r.exit_code is not None and not (r.state == "done" and r.exit_code == 0):
        note.append(f"exit {r.exit_code}")
    if r.slurm and r.slurm.get("state"):
        s = r.slurm
        note.append(
            f"slurm {s['job']}_{s['task']} {s['state']}"
            + (f" ({s['reason']})" if s.get("reason") else "")
            + (f" on {s['node']}" if s.get("node") else "")
            + (f", requeued {s['restarts']}x" if s.get("restarts") else "")
        )
    elif r.slurm and r.slurm.get("restarts"):
        note.append(f"requeued {r.slurm['restarts']}x")
    if r.line:
        note.append(r.line)
    if r.next:
        note.append(f"next: {r.next}")
    return (
        r.name,
        r.state,
        eps,
        turns,
        rate(r.calls_per_s, ".2f"),
        rate(r.tokens_per_s, ".0f"),
        _ago(r.since_turn_s),
        "-" if r.eta_s is None else duration(r.eta_s),
        "; ".join(note),
    )


def table(rows: list[Row]) -> str:
    t = total(rows)
    states = ", ".join(f"{n} {s}" for s, n in t.states.items())
    eta = "-" if t.eta_s is None else duration(t.eta_s)
    if t.eta_s is not None and t.eta_excludes:
        eta += f" (+{t.eta_excludes} not moving)"
    last = (
        f"total ({t.rows})",
        states,
        f"{t.episodes_finished}/{t.episodes_total}",
        f"{t.turns_committed}/{t.turns_possible}" if t.turns_possible else f"{t.turns_committed}",
        f"{t.calls_per_s:.2f}",
        f"{t.tokens_per_s:.0f}",
        "",
        eta,
        "",
    )
    cells = [HEAD, *(_row_cells(r) for r in rows), last]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEAD) - 1)]

    def line(c: tuple[str, ...]) -> str:
        return ("  ".join(x.ljust(w) for x, w in zip(c, widths, strict=False)) + "  " + c[-1]).rstrip()

    out = [line(HEAD), *(line(c) for c in cells[1:-1]), "-" * (sum(widths) + 2 * len(widths)), line(last)]
    return "\n".join(out)


def render(cfg: RunConfig, now: float) -> tuple[str, dict[str, Any]]:
    # The JSON document is for a program: it must be the only thing on stdout, so whatever else prints while
    # the rows are read (a library's own print) goes to stderr.
    with contextlib.redirect_stdout(sys.stderr) if cfg.status.format == "json" else contextlib.nullcontext():
        rows = status_rows(list(cfg.runs), Thresholds.of(cfg), now)
        doc = document(rows, now)
    text = json.dumps(doc, indent=1) if cfg.status.format == "json" else table(rows)
    return text, doc


def _show(text: str, tty: bool) -> None:
    """`text` in one write, whatever the format: a reader that takes the first line (`| head -1`) then
    finds the command done (exit 0) whenever the output fit in the pipe, and closes it under the writer
    (141, entry.py) only when it did not; never a race between a table's lines and the reader. The bytes
    go out until all are written: a bare descriptor's write may take only part of them (a pipe whose
    reader left takes what it had room for), and the rest must not be dropped without a word."""
    out = ("\x1b[H\x1b[2J" if tty else "") + text + "\n"  # home and clear: a terminal's table redrawn in place
    sys.stdout.flush()
    raw = getattr(sys.stdout, "buffer", None)
    if raw is None:  # a text-only stream (a capture in tests): it takes the whole string
        sys.stdout.write(out)
        sys.stdout.flush()
        return
    left = memoryview(out.encode(sys.stdout.encoding or "utf-8", sys.stdout.errors or "strict"))
    while left:
        left = left[raw.write(left) or 0 :]
    raw.flush()


def main(cfg: RunConfig) -> int:
    if not cfg.runs:
        raise ConfigError(
            "runs", "give the run directories to look at: runs=[DIR,...] (a sharded run, a sweep folder, a glob)"
        )
    text, _ = render(cfg, time.time())  # every entry checked (one line, exit 2) before anything is drawn
    tty = cfg.status.watch is not None and sys.stdout.isatty()
    try:
        while True:
            _show(text, tty)
            if cfg.status.watch is None:
                break
            if not tty:
                print(flush=True)  # a blank line between two readings in a log
            time.sleep(cfg.status.watch)
            text, _ = render(cfg, time.time())
    except KeyboardInterrupt:
        pass
    return 0
