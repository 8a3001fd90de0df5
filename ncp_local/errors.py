"""The rig-wide "bad input" error, and how user input is shown in a one-line message.

Every layer raises `InputError` for input it refuses (a spec, a config key, a
prompt pack, a run directory): it names the file and the field, and every entry
point turns it into one `error:` line and exit code 2 (`execution/exits.py`).
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 60
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxtuple, _SHOW.maxset = 2, 4, 4, 4, 4


def shown(value: Any, limit: int = 80) -> str:
    """A repr of user input short enough for a one-line error, whatever its size or depth."""
    text = _SHOW.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class InputError(ValueError):
    """Input the rig refuses before anything runs; names the file (or `config`) and the field."""

    def __init__(self, file: str | Path, field: str, message: str) -> None:
        self.file = str(file)
        self.field = field
        self.message = message
        super().__init__(f"{self.file}: {field}: {message}" if field else f"{self.file}: {message}")
