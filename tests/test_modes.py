"""The modes table is the one list of modes: run.py dispatches through it, --help prints it, the docs'
modes reference is generated from it, and every mode's module has the entry the table loads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local import modes
from ncp_local.config import ConfigError
from ncp_local.launch.help import modes_text
from test_docs import gen

ROOT = Path(__file__).resolve().parent.parent


def test_every_mode_module_is_in_the_table_and_has_its_entry() -> None:
    files = {p.stem for p in (ROOT / "ncp_local" / "modes").glob("*.py") if not p.stem.startswith("_")}
    assert files == {m.name for m in modes.MODES}
    for m in modes.MODES:
        tree = ast.parse((ROOT / "ncp_local" / "modes" / f"{m.name}.py").read_text(encoding="utf-8"))
        main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
        # The config typed once at the entry (modes/_dispatch.py calls `main(cfg)`; its source is `cfg.source`).
        assert [a.arg for a in main.args.args] == ["cfg"], m.name


def test_every_mode_is_in_the_contract_that_keeps_modes_apart() -> None:
    """import-linter checks only the modules its contract lists: a mode left out may import another unseen."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    [apart] = [c for c in contracts["contracts"] if c["type"] == "independence" and "mode" in c["name"]]
    assert set(apart["modules"]) == {f"ncp_local.modes.{m.name}" for m in modes.MODES}


def test_the_docs_list_the_table() -> None:
    assert "<!-- gen:modes -->" in (ROOT / "docs" / "reference" / "modes.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z]+)` \| (.+) \|$", gen.generate("modes"), re.M)
    assert [(name, gen.uncell(text)) for name, text in rows] == [(m.name, m.help) for m in modes.MODES]


def test_the_config_comment_lists_the_table() -> None:
    """conf/config.yaml's `mode:` comment, which the configuration reference shows, names every mode."""
    line = next(
        x for x in (ROOT / "conf" / "config.yaml").read_text(encoding="utf-8").splitlines() if x.startswith("mode:")
    )
    assert [m.strip() for m in line.split("#", 1)[1].split("|")] == [m.name for m in modes.MODES]


def test_help_prints_the_table() -> None:
    text = modes_text()
    assert [line.split()[0] for line in text.splitlines()] == [f"mode={m.name}" for m in modes.MODES]
    out = run_cli("--help", cwd=ROOT)
    assert out.returncode == 0 and text in out.stdout


def test_an_unknown_mode_names_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        modes.find("bogus")
    assert err.value.field == "mode" and ", ".join(m.name for m in modes.MODES) in err.value.message
