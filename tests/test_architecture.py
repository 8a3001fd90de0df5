"""The package's structure, as docs/design/architecture.md states it: layers (import-linter's contracts in
pyproject.toml, also run by `make test`), no import cycle between any two modules, and imports inside
functions only where they defer a heavy optional package."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ncp_local"
# Packages an import inside a function may defer (heavy, optional, or only on an engine's path).
DEFERRED = (
    "vllm",
    "torch",
    "transformers",
    "openai",
    "xgrammar",
    "llguidance",
    "outlines_core",
    "setproctitle",
    "psutil",
    "inspect_ai",
    "lifelines",  # pandas and its own fitters: about 1 s; the tests' Aalen-Johansen oracle
    # matplotlib, imported by the report only once it has a folder to write its config to (report/mpl_home.py).
    ".plots",
    "mlflow",
    "wandb",
    "ncp_local.engines.vllm",
    "ncp_local.engines.openai",
    "..engines.vllm",
    "..engines.vllm_args",
    "..engines.openai",
    # The command line answers a bad override in under a second, before the modes and the
    # run's machinery (scipy, matplotlib: about 2 s of imports) load (launch/cli.py).
    "ncp_local.modes",
    "ncp_local.execution.life",
    "ncp_local.launch.sweep",
    "ncp_local.launch.point_index",
    # run.py's and `ncp-local`'s entry imports the command line inside its Ctrl-C guard (entry.py), and
    # `ncp-local-submit`'s the submitter.
    "ncp_local.launch.cli",
    "ncp_local.launch.submit",
    # The submitter's serving half, on `--serve` only: it needs the engine extra (launch/submit.py).
    "ncp_local.launch.served",
)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(grimp.build_graph("ncp_local")) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(grimp.build_graph("cyc")) == [["cyc.a", "cyc.b", "cyc.c"]]


def test_layer_contracts_hold() -> None:
    tool = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run(
        [str(tool), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_imports_inside_functions_only_defer_heavy_packages() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = ["." * node.level + (node.module or "")]
                else:
                    continue
                if not all(any(n == d or n.startswith(d + ".") for d in DEFERRED) for n in names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {', '.join(names)}")
    assert offenders == []


def test_every_folder_says_what_it_holds() -> None:
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(re.findall(r"[.!?](\s|$)", doc)) >= 1, init


def test_architecture_page_names_every_module_of_execution_and_rundir() -> None:
    # docs/design/architecture.md says where each thing lives: a module added to (or moved out of) the
    # layers that play and record a run without the page saying so fails here.
    page = (ROOT / "docs" / "design" / "architecture.md").read_text(encoding="utf-8")
    for layer in ("execution", "rundir"):
        for path in sorted((PACKAGE / layer).glob("*.py")):
            if path.name != "__init__.py":
                assert f"{path.name}`" in page, f"{layer}/{path.name} is not named in architecture.md"
    named = set(re.findall(r"`(?:execution|rundir)/(\w+)\.py", page))
    gone = sorted(n for n in named if not any((PACKAGE / d / f"{n}.py").exists() for d in ("execution", "rundir")))
    assert gone == [], f"architecture.md names modules that no longer exist: {gone}"
