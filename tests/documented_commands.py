"""The command lines README.md and docs/ show, read from the pages (tests/test_documented_commands.py runs them).

A command line is a line of a code block (fenced or indented), or a line that is one inline code span
and nothing else, that calls `run.py` or `slurm/submit.py` (`python`, `$PY`, `.venv/bin/python`, or the
script alone), or the installed commands `ncp-local` (which is `run.py`) and `ncp-local-submit` (which is
`slurm/submit.py`); a trailing backslash continues it on the next line. What follows its ` # ` is the
page's comment; a comment that ends with one of `NEEDS` says the line needs what a test machine does
not have, and the test then only checks that it parses. A comment that starts `exit N` says the line
ends with that exit code (a refusal the page shows on purpose).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The marks a page gives a command that needs more than the rig and its scripted engine.
NEEDS = (
    "needs GPUs",
    "loads a model",
    "needs Slurm",
    "needs a server",
    "needs the official code",
    "needs the run above",  # reads what a line above that needs one of these wrote
)
# The pages whose commands are records of what was once run (dated measurements, with their own
# paths and hours-long workloads): checked to parse, never run.
RECORDS = ("docs/measurements/",)

_CALL = re.compile(
    r"^(?:[A-Z_]+=\S+\s+)*(?:/usr/bin/time -v\s+)?"  # an environment and a timer before it
    r"(?:(?:python3?|\$PY|\.venv/bin/python)\s+(run\.py|slurm/submit\.py)|(slurm/submit\.py)|(ncp-local(?:-submit)?))"
    r"(?=\s|$)"
)
# The installed commands and the scripts they are.
_INSTALLED = {"ncp-local": "run.py", "ncp-local-submit": "slurm/submit.py"}
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Command:
    page: str  # relative to the repository
    line: int  # where the command starts on the page
    text: str  # as the page shows it (continuations joined)
    script: str  # run.py or slurm/submit.py
    args: tuple[str, ...]  # its arguments, as a shell would split them (the comment dropped)
    comment: str

    @property
    def needs(self) -> str | None:
        """What the page says the line needs beyond the scripted engine (None: it runs here)."""
        if self.page.startswith(RECORDS):
            return "a record of a measurement"
        return next((n for n in NEEDS if self.comment.rstrip(" .").endswith(n)), None)

    @property
    def exit_code(self) -> int:
        """The exit code the page says the line ends with (`# exit 2: ...`), 0 when it says none."""
        said = re.match(r"exit (\d+)\b", self.comment)
        return int(said.group(1)) if said else 0

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every line: a code block's as it is, a line of one inline code span as that
    span (prose never starts with a call of the scripts, so only code matches `_CALL`)."""
    out: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            continue
        single = re.fullmatch(r"\s*(?:\d+\.\s+|[-*]\s+)?`([^`]+)`\s*", line)
        out.append((number, single.group(1) if single else line.strip()))
    return out


def commands(page: Path) -> list[Command]:
    return commands_in(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)))


def commands_in(text: str, rel: str) -> list[Command]:
    """The command lines of a page's text (`rel`: the page's name in the lines' `where`)."""
    lines = _code_lines(text)
    found: list[Command] = []
    i = 0
    while i < len(lines):
        number, text = lines[i]
        while text.endswith("\\") and i + 1 < len(lines):  # continued on the next line
            i += 1
            text = text[:-1].rstrip() + " " + lines[i][1]
        i += 1
        call = _CALL.match(text)
        if not call:
            continue
        body, _, comment = text[call.end() :].partition(" # ")
        if body.lstrip().startswith("#"):
            body, comment = "", body.lstrip()[1:]
        script = call.group(1) or call.group(2) or _INSTALLED[call.group(3)]
        found.append(Command(rel, number, text, script, tuple(shlex.split(body)), comment.strip()))
    return found


def every_command() -> list[Command]:
    return [c for page in pages() for c in commands(page)]
