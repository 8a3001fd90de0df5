"""The report's intervals and pass^k proven on synthetic runs with a known truth (scripts/coverage.py).

A seeded, small copy of the coverage simulation (docs/measurements/2026-12-04-coverage.md has the full
table, 1,000 runs per row): stories that differ strongly in how hard they are to keep, four plays each,
30% of plays censored at random. It fails when the S(t) band stops resampling stories (Greenwood's band
takes the 4 plays of a story for 4 independent episodes and covers far less than 95%) or when pass^k
drops the plays censored before t again (a bias of -10% and more).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _coverage():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("coverage_sim", ROOT / "scripts" / "coverage.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["coverage_sim"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows() -> dict[str, object]:
    cov = _coverage()
    setting = cov.Setting(stories=40, plays=4, max_turns=8, censoring=0.3, hazard=(1.0, 3.0))
    out = cov.simulate(setting, runs=200, resamples=200, seed=1, only=("S(t)", "pass^k(t)"))
    return {r.name: r.summary() for r in out}


def test_survival_band_covers_with_trials_and_censoring(rows: dict[str, dict[str, float]]) -> None:
    s = rows["S(t)"]
    # 200 runs: the Monte Carlo error of a 95% coverage is 1.5 points; Greenwood's band covers about 80%.
    assert 90.0 <= s["cover %"] <= 99.0, s
    assert abs(s["bias / se"]) < 3, s


def test_pass_k_is_unbiased_under_censoring_and_its_band_covers(rows: dict[str, dict[str, float]]) -> None:
    for name in ("pass^2(t)", "pass^4(t)"):
        r = rows[name]
        assert abs(r["bias / se"]) < 3 and abs(r["bias %"]) < 5, (name, r)
        assert 90.0 <= r["cover %"] <= 99.0, (name, r)


def test_the_simulated_episode_names_are_names_the_rig_reads() -> None:
    """Every episode the script makes (its runs' results, its review sheet's rows) is one the rig's own
    parse_episode accepts, as the story and trial it plays (`s3~t0` was refused)."""
    from ncp_local.protocol.trials import parse_episode

    cov = _coverage()
    plays = [cov.Play(story, 4, "fact") for story in (0, 1, 0, 0, 1)]
    run = cov._sim_run(plays, max_turns=8)
    rig = cov.Rig.load()
    _, verdicts = cov._review(rig, plays, np.random.default_rng(0), 0.95)
    names = [*run.results, *(v.spec_id for v in verdicts)]
    assert verdicts and len(run.results) == len(plays)
    for name in names:
        parse_episode(name)  # raises on a name no episode has
    for name, result in run.results.items():
        assert parse_episode(name) == (result.spec_id, result.trial), name
    assert sorted(run.results) == ["s0", "s0~t1", "s0~t2", "s1", "s1~t1"]
