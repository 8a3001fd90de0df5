"""The HTML pages' stylesheet and scripts: files in `report/assets/`, shipped as package data."""

from __future__ import annotations

import functools
from importlib.resources import files


@functools.cache
def asset(name: str) -> str:
    """The text of `report/assets/<name>` (as installed: a wheel carries it, see pyproject.toml)."""
    return (files("ncp_local.report") / "assets" / name).read_text(encoding="utf-8")
