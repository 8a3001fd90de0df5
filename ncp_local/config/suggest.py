"""A mistyped key, group option or name answered with the closest real one ("did you mean ...?").

Hydra answers an unknown key with `Could not override 'max_turn'; To append to your config use
+max_turn=4`, which sends the user to add a key nothing reads. The rig answers from the config's own
keys instead: `max_turn: unknown key (did you mean max_turns?)`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

# Hydra's wording for an override of a key the config does not have, and for a group option that
# does not exist (its message then lists the group's options, each on a tab-indented line).
_UNKNOWN_KEY = re.compile(r"Could not override '([^']+)'")
_UNKNOWN_OPTION = re.compile(r"Could not find '([^']+)/([^'/]+)'")


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The one of `choices` closest to `word` (difflib's ratio at least 0.6), or None."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean X?)` for the closest of `choices`, or "" when none is close."""
    near = closest(word, choices)
    return f" (did you mean {near}?)" if near else ""


def dotted_keys(tree: Mapping[Any, Any], prefix: str = "") -> Iterator[str]:
    """Every key of a nested mapping as a dotted path (sections and the keys under them)."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, Mapping):
            yield from dotted_keys(value, f"{path}.")


def unknown_override_line(message: str, keys: Callable[[], Iterable[str]]) -> str | None:
    """Hydra's error for an unknown key or group option as the rig's one line, or None for another error.

    `keys` gives the config's dotted keys (called only for an unknown key: it composes the config).
    """
    message = message.split("Config search path:")[0]  # Hydra appends its search path to some errors
    found = _UNKNOWN_KEY.search(message)
    if found:
        key = found.group(1)
        return f"{key}: unknown key{did_you_mean(key, keys()) or ' (every key: docs/reference/configuration.md)'}"
    found = _UNKNOWN_OPTION.search(message)
    if found:
        group, option = found.groups()
        options = [line.strip() for line in message.splitlines() if line.startswith("\t")]
        near = closest(option, options)
        if near:
            return f"{group}: unknown option {option!r} (did you mean {near}?)"
        return f"{group}: unknown option {option!r}" + (f" (options: {', '.join(options)})" if options else "")
    return None
