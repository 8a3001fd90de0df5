"""One statement of the Pythons the rig supports (issue 57): pyproject's requires-python, its classifiers,
the README's sentence and the packaging page's table name the same minor versions, and the newest of
them is the one `make test` runs the no-engine tier on (the Makefile's PY_NEWEST)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _minors(low: str, high: str) -> list[str]:
    """3.11 .. 3.13 -> ['3.11', '3.12', '3.13']."""
    return [f"3.{m}" for m in range(int(low.split(".")[1]), int(high.split(".")[1]) + 1)]


def test_the_supported_pythons_are_stated_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found = re.fullmatch(r">=(3\.\d+),<(3\.\d+)", project["requires-python"].replace(" ", ""))
    assert found, project["requires-python"]
    below = f"3.{int(found[2].split('.')[1]) - 1}"
    supported = _minors(found[1], below)

    classified = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if re.search(r"Python :: 3\.\d+$", c)]
    assert classified == supported, (classified, supported)

    readme = re.search(r"on Python (3\.\d+) to (3\.\d+)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert readme and _minors(readme[1], readme[2]) == supported, readme

    packaging = (ROOT / "docs" / "development" / "packaging.md").read_text(encoding="utf-8")
    assert f'`requires-python = "{project["requires-python"]}"`' in packaging
    rows = re.findall(r"^\| (3\.\d+) \|", packaging, re.MULTILINE)
    assert sorted(rows, key=lambda v: int(v.split(".")[1])) == supported, rows

    newest = re.search(r"^PY_NEWEST\s*\?=.*PYENV_VERSION=(3\.\d+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert newest and newest[1] == supported[-1], newest
