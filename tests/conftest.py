"""Shared fixtures, and the tiers: a test is marked by what it needs, read off its fixtures.

`engine` (an in-process vLLM: the session's `engine` fixture, or a test that starts its own and says
so with the marker), `served` (a `vllm serve`), `slurm` (the local Slurm cluster), `browser`
(headless Chromium). A test that starts nothing carries none of them. `slow` is set by hand, only on
a larger copy of a check that `make test` keeps at a smaller size. `make test` runs all but `slow`.
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from newest_pass import in_newest_pass  # noqa: E402  (tests/ is on the path from the line above)


@pytest.fixture(scope="session")
def official_dataset() -> Path:
    """The official NCP-Bench release, from NCP_BENCH_DATASET (set by .ci/run)."""
    path = os.environ.get("NCP_BENCH_DATASET")
    if not path or not (Path(path) / "index.yaml").exists():
        pytest.skip("official dataset not available (set NCP_BENCH_DATASET to its directory)")
    return Path(path)


@pytest.fixture(scope="session")
def official_prompts() -> Path:
    """A clone of the reference repository's prompt files, from NCP_BENCH_REFERENCE (set by .ci/run)."""
    path = os.environ.get("NCP_BENCH_REFERENCE")
    if not path or not (Path(path) / "src" / "ncpbench" / "prompts").is_dir():
        pytest.skip("official prompt files not available (set NCP_BENCH_REFERENCE to a reference clone)")
    return Path(path)


@pytest.fixture(scope="session")
def scripted_official_run(official_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The official dataset played on the scripted engine for 15 turns: a mix of endings (conflicts of
    each type, stories resolved, stories stopped at the limit). Read it, never write into it."""
    from helpers import play_scripted_official

    return play_scripted_official(official_dataset, tmp_path_factory.mktemp("scripted-official") / "run")


# The fixture that puts a test in a tier (tests/engine/conftest.py defines `engine`, `reference_sweep` and
# `served`).
TIER_OF_FIXTURE = {
    "engine": "engine",
    "reference_sweep": "engine",
    "served": "served",
    "slurm": "slurm",
    "chromium": "browser",
}
# A test's tier for the time summary: the first of these it carries, else "none" (starts nothing).
TIERS = ("slow", "served", "slurm", "engine", "browser")
ENGINE_TIMEOUT_S = 1800
_SECONDS: dict[str, float] = {}
_COUNT: dict[str, int] = {}


# First: pytest-xdist's loadgroup reads the xdist_group marks in its own modifyitems hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        needs = set(getattr(item, "fixturenames", ()))
        for fixture, tier in TIER_OF_FIXTURE.items():
            if fixture in needs:
                item.add_marker(tier)
        if in_newest_pass(item.nodeid):
            item.add_marker("newest")
        # Carried on the item's reports, so the summary sees it also from pytest-xdist's workers.
        item.user_properties.append(("tier", next((t for t in TIERS if item.get_closest_marker(t)), "none")))
        if any(item.get_closest_marker(t) for t in ("engine", "served", "slurm")):
            # Under pytest-xdist (`-n 2 --dist loadgroup`) all of these run in one worker, so the session's
            # engine, server and reference sweep start once, and never two engines at once: two groups side
            # by side took as long as one after the other (10.4 against 10.3 min, 2026-12-03) and once
            # lost the Slurm job's server engine (docs/measurements/test-times.md).
            item.add_marker(pytest.mark.xdist_group("engines"))
            if item.get_closest_marker("timeout") is None:
                # pyproject's 900 s is for tests that start nothing; an engine test's own waits are
                # up to 900 s on top of a session engine's start (minutes on a slow 2-core machine).
                item.add_marker(pytest.mark.timeout(ENGINE_TIMEOUT_S))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Setup, call and teardown: a session fixture's engine start counts in the first test that asks for it.
    tier = dict(report.user_properties).get("tier", "none")
    _SECONDS[tier] = _SECONDS.get(tier, 0.0) + report.duration
    if report.when == "call":
        _COUNT[tier] = _COUNT.get(tier, 0) + 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line: where the time went, by tier (docs/measurements/test-times.md keeps these figures)."""
    if not _SECONDS:
        return
    parts = [
        f"{tier} {_COUNT.get(tier, 0)} tests {_SECONDS[tier] / 60:.1f} min"
        for tier in (*TIERS, "none")
        if tier in _SECONDS
    ]
    terminalreporter.write_line("time by tier: " + ", ".join(parts))


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's headless Chromium (.ci/run installs it)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not installed")
    return CHROMIUM


@pytest.fixture(scope="session")
def slurm() -> None:
    """The one-node Slurm cluster of scripts/start_slurm.sh (.ci/run starts it)."""
    if not shutil.which("sinfo") or not shutil.which("sbatch"):
        pytest.skip("Slurm client not installed (scripts/start_slurm.sh starts a local cluster)")
    probe = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"no Slurm controller reachable: {probe.stderr.strip()}")


@pytest.fixture
def window_fills(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it to make every fact update after the opening find no room in the context window: each episode
    then ends context_limit before its first committed turn, so a run of them measured nothing (exit 5,
    rundir/invalid.py)."""
    from ncp_local.engines.base import ContextOverflow
    from ncp_local.engines.scripted import ScriptedEngine

    generate = ScriptedEngine.generate

    async def no_room(self: ScriptedEngine, request: Any) -> Any:
        if request.tags["stage"] == "fact_update" and request.tags["turn"] >= 0:
            raise ContextOverflow("prompt of 8100 tokens leaves 92 for the output; the stage needs 256")
        return await generate(self, request)

    return lambda: monkeypatch.setattr(ScriptedEngine, "generate", no_room)
