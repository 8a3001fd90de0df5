"""A sweep's points (ncp_local/execution/points.py): the one expander every launcher uses gives Hydra's
basic sweeper's jobs, in its order; the override bench.sweep writes reads back as the same values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from ncp_local.errors import InputError
from ncp_local.execution import points
from ncp_local.rundir import layout


def _hydra_jobs(overrides: list[str]) -> list[list[str]]:
    """What Hydra's own basic sweeper makes of these task overrides (no config file params)."""
    return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)[0]


def test_points_are_hydras_jobs_in_its_order() -> None:
    task = ["engine=scripted", "seed=0,1", "max_turns=2", "narrator.temperature=0.2,0.6"]
    grid = points.expand([*task, "hydra/launcher=batched", "hydra.sweep.dir=sw"])
    assert [list(p.overrides) for p in grid.points()] == _hydra_jobs(task)
    assert [p.swept for p in grid.points()][:2] == [
        ("seed=0", "narrator.temperature=0.2"),
        ("seed=0", "narrator.temperature=0.6"),
    ]
    assert grid.launcher.endswith(".BatchedLauncher")


def test_a_config_files_sweeper_params_come_first() -> None:
    # experiment=auditor_sensitivity declares `auditor: qwen3,llama3_1_8b,...` under hydra.sweeper.params.
    grid = points.expand(["experiment=auditor_sensitivity", "seed=0,1"])
    swept = [p.swept for p in grid.points()]
    assert swept[:2] == [("auditor=qwen3", "seed=0"), ("auditor=qwen3", "seed=1")] and len(swept) == 8
    # A command-line value of the same key replaces the param in its place; a fixed one is not swept.
    assert [p.swept for p in points.expand(["experiment=auditor_sensitivity", "auditor=smollm2"]).points()] == [()]


def test_past_a_limit_each_value_once() -> None:
    grid = points.expand(["seed=0,1,2", "max_turns=1,2"])
    assert grid.count() == 6 and len(grid.points()) == 6
    assert [p.swept for p in grid.points(most=4)] == [
        ("seed=0", "max_turns=1"),
        ("seed=1", "max_turns=1"),
        ("seed=2", "max_turns=1"),
        ("seed=0", "max_turns=2"),
    ]


def test_what_only_hydras_sweeper_expands_is_set_aside() -> None:
    grid = points.expand(["seed=glob(*)", "max_turns=interval(1,2)", "limit=1"])
    assert [line for line, _ in grid.unexpanded] == ["seed=glob(*)", "max_turns=interval(1,2)"]
    assert [p.overrides for p in grid.points()] == [("limit=1",)]


@pytest.mark.parametrize(
    "values",
    [
        [0.2, 0.6],
        [0, 1],
        [True],
        ["qwen3", "a b", "it's", "true", "1e3", "end\\"],
        [[0, 1], [2]],
        [{"a": 1}],
        [None, 1e-05],
    ],
)
def test_sweep_of_reads_back_as_the_same_values(values: list[Any]) -> None:
    o = OverridesParser.create().parse_override(points.sweep_of("x", values))
    assert o.is_sweep_override()
    assert [getattr(v, "text", v) for v in o.sweep_iterator()] == values


def test_check_refuses_a_bad_point_in_one_line() -> None:
    with pytest.raises(InputError, match="max_turns"):
        points.check(points.load(["engine=scripted", "max_turns=0"]))
    with pytest.raises(InputError) as bad:
        points.load(["engine=scripted", "out_dir=${nope}"])
    assert str(bad.value).startswith("config: ") and "\n" not in str(bad.value)


def test_a_shard_is_finished_with_its_marker_and_its_results(tmp_path: Path) -> None:
    specs = ["a", "b", "c", "d", "e"]
    shard = layout.shard_path(tmp_path, 1, 2)
    assert layout.shard_of(specs, 1, 2) == ("b", "d") and shard.name == "shard-001-of-002"
    (shard / layout.RESULTS).mkdir(parents=True)
    for s in ("b", "d"):
        layout.result_file(shard, s).write_text("{}")
    assert not layout.shard_finished(tmp_path, 1, 2, specs)  # no DONE marker yet
    (shard / layout.DONE).write_text("2\n")
    assert layout.shard_finished(tmp_path, 1, 2, specs) and layout.is_done(shard)
    assert not layout.shard_finished(tmp_path, 0, 2, specs)
