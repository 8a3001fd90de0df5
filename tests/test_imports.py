"""Every module of the package imports on this Python, in a fresh interpreter and without the engine
packages it defers (vLLM, torch, transformers): the newest-Python pass runs this, so a syntax or an
import that a new Python refuses fails here even in a module no other test of that pass reaches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from newest_pass import NEWEST_PASS

ROOT = Path(__file__).resolve().parent.parent

# Imports every module under ncp_local and prints the ones that failed, with the error; also which of
# the deferred engine packages the imports pulled in (none may: they load only on an engine's path).
_PROBE = """
import importlib, json, pkgutil, sys, traceback
import ncp_local
failed = {}
names = [m.name for m in pkgutil.walk_packages(ncp_local.__path__, "ncp_local.")]
for name in names:
    try:
        importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc(limit=3)
heavy = sorted(m for m in ("vllm", "torch", "transformers") if m in sys.modules)
print(json.dumps({"count": len(names), "failed": failed, "heavy": heavy}))
"""


def test_every_module_imports_without_the_engine_packages() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["count"] > 100, found["count"]  # the walk found the package, not an empty folder
    assert not found["failed"], "\n".join(f"{name}:\n{tb}" for name, tb in found["failed"].items())
    assert not found["heavy"], f"importing the package loaded {found['heavy']}"


def test_the_newest_pass_names_only_tests_that_exist() -> None:
    missing = []
    for entry in NEWEST_PASS:
        path, _, name = entry.partition("::")
        source = ROOT / "tests" / path
        if not source.is_file() or (name and f"def {name}(" not in source.read_text(encoding="utf-8")):
            missing.append(entry)
    assert not missing, f"tests/newest_pass.py names tests that are gone: {missing}"
