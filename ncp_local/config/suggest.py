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
_UNKNOWN_DELETE = re.compile(r"Could not delete from config\. '([^']+)' does not exist")
# argparse's wording for an option it does not know, and for a value outside an option's choices.
_UNKNOWN_ARGS = re.compile(r"unrecognized arguments: (.*)")
_BAD_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


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


def unknown_key(key: str, keys: Iterable[str]) -> str:
    """What is said of a key the config does not have, however it was given (`key=`, `+key=`, `~key`):
    `unknown key (did you mean X?)`."""
    keys = list(keys)
    section, _, leaf = key.rpartition(".")
    if section in keys:
        # A key in a section that exists: the closest of that section's own keys, compared by name
        # (`engine.bogus` is not `engine.delay_s` because both start with `engine.`).
        names = [k.removeprefix(section + ".") for k in keys if k.startswith(section + ".")]
        near = closest(leaf, [n for n in names if "." not in n])
        hint = f" (did you mean {section}.{near}?)" if near else ""
    else:
        hint = did_you_mean(key, keys)
    return f"unknown key{hint or ' (every key: docs/reference/configuration.md)'}"


def unknown_override_line(message: str, keys: Callable[[], Iterable[str]]) -> str | None:
    """Hydra's error for an unknown key or group option as the rig's one line, or None for another error.

    `keys` gives the config's dotted keys (called only for an unknown key: it composes the config).
    """
    message = message.split("Config search path:")[0]  # Hydra appends its search path to some errors
    found = _UNKNOWN_KEY.search(message) or _UNKNOWN_DELETE.search(message)
    if found:
        return f"{found.group(1)}: {unknown_key(found.group(1), keys())}"
    found = _UNKNOWN_OPTION.search(message)
    if found:
        group, option = found.groups()
        options = [line.strip() for line in message.splitlines() if line.startswith("\t")]
        near = closest(option, options)
        if near:
            return f"{group}: unknown option {option!r} (did you mean {near}?)"
        return f"{group}: unknown option {option!r}" + (f" (options: {', '.join(options)})" if options else "")
    return None


def argparse_line(message: str, options: Iterable[str]) -> str:
    """argparse's error for a command line's options with the closest real option (or choice) added.

    `options`: the parser's option strings (`--shards`, `-m`, ...). An unknown option gets ` (did you
    mean --X?)`; a value outside an option's choices, the closest choice; any other message is kept.
    """
    found = _UNKNOWN_ARGS.search(message)
    if found:
        flags = [word.split("=", 1)[0] for word in found.group(1).split() if word.startswith("-")]
        near = next((n for n in (closest(f, options) for f in flags) if n), None)
        return f"{message} (did you mean {near}?)" if near else message
    found = _BAD_CHOICE.search(message)
    if found:
        choices = re.findall(r"'([^']*)'", found.group(2))
        return message + did_you_mean(found.group(1), choices)
    return message
