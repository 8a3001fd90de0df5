"""The analysis tables (`mode=export export.format=parquet`, `ncp_local.analysis`) on a scripted official
run: one row per turn record and per call-log line, sums that equal the report's, the report's main table
recomputed with pandas to the last digit, the ledger and conflict tables consistent with the episodes,
a sweep folder with its points, and the loaders giving the same frames from run directories and files."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_runner import run_cli
from ncp_local import analysis
from ncp_local.errors import InputError
from ncp_local.report.cost import cost_table
from ncp_local.report.parquet import build_tables, read_table
from ncp_local.report.runs import attach_specs, load_run
from ncp_local.report.table_rows import Source
from ncp_local.report.table_schema import META_VERSION, TABLES
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.sweep_index import read_index


@pytest.fixture(scope="module")
def exported(scripted_official_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tables folder, report folder) of the scripted official run."""
    base = tmp_path_factory.mktemp("tables")
    res = run_cli(
        "mode=export", f"runs=[{scripted_official_run}]", "export.format=parquet", f"export.out={base / 'tables'}"
    )
    assert res.returncode == 0, res.stderr
    assert "turns:" in res.stdout and f"tables: {base / 'tables'}" in res.stdout
    rep = run_cli(
        "mode=report", f"runs=[{scripted_official_run}]", f"report.out={base / 'report'}", "report.html=false"
    )
    assert rep.returncode == 0, rep.stderr
    return base / "tables", base / "report"


def frames(folder: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(folder / f"{name}.parquet") for name in TABLES}


def test_rows_are_turn_records_and_call_log_lines(scripted_official_run: Path, exported: tuple[Path, Path]) -> None:
    t = frames(exported[0])
    run = load_run(scripted_official_run)
    assert len(t["episodes"]) == len(run.results) == 100
    assert len(t["turns"]) == sum(len(r.turns) for r in run.results.values())
    with open(scripted_official_run / "calls.jsonl", "rb") as f:
        assert len(t["calls"]) == sum(1 for _ in f)
    # Turns per episode, from the turns table, are the episodes' (the report's) turns.
    per_episode = t["turns"].groupby("episode").size()
    assert (per_episode.reindex(t["episodes"].episode, fill_value=0).to_numpy() == t["episodes"].turns.to_numpy()).all()
    assert set(t["episodes"].trial) == {0} and (t["episodes"].episode == t["episodes"].spec_id).all()


def test_tokens_per_stage_equal_the_cost_table(scripted_official_run: Path, exported: tuple[Path, Path]) -> None:
    calls = frames(exported[0])["calls"]
    table = cost_table(load_run(scripted_official_run))
    sums = calls.groupby(["role", "stage"])[["prompt_tokens", "cached_tokens", "generated_tokens"]].sum()
    assert len(sums) == len(table.rows)
    for (role, stage), u in table.rows.items():
        got = sums.loc[(role, stage)]
        assert (got.prompt_tokens, got.cached_tokens, got.generated_tokens) == (
            u.prompt_tokens,
            u.cached_tokens,
            u.generated_tokens,
        )
        assert int(calls[(calls.role == role) & (calls.stage == stage)].attempt.eq(0).sum()) == u.calls
    # Per turn and per episode, the same call log summed by key.
    t = frames(exported[0])
    assert t["episodes"].prompt_tokens.sum() == calls.prompt_tokens.sum()
    in_turns = calls.merge(t["turns"][["episode", "turn"]], on=["episode", "turn"])
    assert t["turns"].generated_tokens.sum() == in_turns.generated_tokens.sum()


def test_pandas_gives_the_reports_main_table(exported: tuple[Path, Path]) -> None:
    eps = pd.read_parquet(exported[0] / "episodes.parquet")
    with open(exported[1] / "results.csv", newline="") as f:
        [row] = list(csv.DictReader(f))
    scored = eps[eps.scored]
    mine = {
        "episodes": len(eps),
        "scored": len(scored),
        "censored": int(scored.censored.sum()),
        "avg_turns": scored.turns.mean(),
        "trajectory_pct": 100 * scored.trajectory_progress.mean(),
        "satisfied_pct": 100 * scored.satisfied.mean(),
        "fact_pct": 100 * scored.fact.mean(),
        "commitment_pct": 100 * scored.commitment.mean(),
        "player_input_pct": 100 * scored.player_input.mean(),
        "conflict_free": int((scored.termination != "conflict").sum()),
        **eps.termination.value_counts().to_dict(),
        "bound_hits": int(eps.bound_hits.sum()),
    }
    for key, value in mine.items():
        # results.csv prints 6 decimals and integers as integers.
        assert float(row[key]) == round(float(value), 6), key
    assert {"conflict", "max_turns", "all_resolved"} <= set(eps.termination)


def test_ledger_events_add_up_to_the_final_state(exported: tuple[Path, Path]) -> None:
    t = frames(exported[0])
    ev, eps = t["ledger_events"], t["episodes"].set_index("episode")
    n = ev.groupby(["episode", "event"]).size().unstack(fill_value=0).reindex(eps.index, fill_value=0)
    assert (n.fact_added == eps.facts_final - eps.initial_facts).all()
    assert (n.node_reached == eps.nodes_completed).all()
    assert (n.commitment_satisfied - n.commitment_pending == eps.commitments_satisfied).all()
    # Every inactive fact at the end was negated by a committed update, but for the facts a spec starts
    # inactive (movie93's two: PROTOCOL section 1).
    inactive_from_start = eps.facts_final - eps.facts_active_final - n.fact_negated
    assert inactive_from_start[inactive_from_start != 0].to_dict() == {"movie93": 2}
    assert (ev.groupby("episode").seq.agg(lambda s: list(s) == list(range(len(s))))).all()
    # Nothing of a turn that did not commit is an event; the opening's updates commit with turn 0.
    turns = t["turns"]
    uncommitted = set(map(tuple, turns[~turns.committed][["episode", "turn"]].to_numpy()))
    assert not uncommitted & set(map(tuple, ev[["episode", "turn"]].to_numpy()))
    assert set(ev[ev.source == "opening"].turn) <= {0}
    # The turns table's running counts agree with the events up to each turn.
    last = turns[turns.committed].groupby("episode").last()
    assert (last.facts_total == eps.loc[last.index].facts_final).all()


def test_conflicts_match_the_endings(exported: tuple[Path, Path]) -> None:
    t = frames(exported[0])
    c, eps = t["conflicts"], t["episodes"].set_index("episode")
    ended = c[c.ended_episode]
    assert set(ended.episode) == set(eps[eps.termination == "conflict"].index)
    for ctype in ("fact", "commitment", "player_input"):
        flagged = set(ended[ended.type == ctype].episode)
        assert flagged == set(eps[eps[ctype]].index), ctype
    # A conflict that stood is on a turn that did not commit; one the review cleared has a verdict.
    assert (c[~c.standing & c.double_checked].confirmed.notna()).all()
    assert set(t["turns"][~t["turns"].committed].episode) == set(ended.episode)
    assert (c.target_text.str.len() > 0).all() and c.failure_mode.isna().all()


def test_schema_is_written_and_checked(exported: tuple[Path, Path], tmp_path: Path) -> None:
    for name, schema in TABLES.items():
        got = pq.read_schema(exported[0] / f"{name}.parquet")
        assert got.names == schema.names
        assert [f.type for f in got] == [c.type for c in schema.columns]
        assert got.metadata[META_VERSION] == str(schema.version).encode()
    # A file of another schema version is refused with its path and what to do.
    table = pq.read_table(exported[0] / "episodes.parquet")
    pq.write_table(
        table.replace_schema_metadata({**table.schema.metadata, META_VERSION: b"0"}), tmp_path / "episodes.parquet"
    )
    with pytest.raises(InputError, match="schema version 0.*export the runs again"):
        read_table(tmp_path, "episodes")


def test_loaders_read_run_directories_and_files_alike(scripted_official_run: Path, exported: tuple[Path, Path]) -> None:
    from_dir = analysis.tables(scripted_official_run)
    from_files = analysis.tables(exported[0])
    for name in TABLES:
        pd.testing.assert_frame_equal(from_dir[name], from_files[name], check_exact=True)
    turns = analysis.turns(scripted_official_run)
    assert list(turns.columns) == TABLES["turns"].names
    with pytest.raises(KeyError, match="no table 'turn'"):
        analysis.tables(scripted_official_run, ["turn"])


def test_runs_without_their_specs_keep_every_row(scripted_official_run: Path, tmp_path: Path) -> None:
    """The spec's columns are null and no fact event is made up; everything from the records stays."""
    run = load_run(scripted_official_run)
    attach_specs(run, str(tmp_path))  # no specs here
    t = build_tables([Source(run)])
    eps = t["episodes"].to_pandas()
    assert eps.title.isna().all() and eps.turns.sum() == sum(len(r.turns) for r in run.results.values())
    events = t["ledger_events"].to_pandas()
    assert not events.event.str.startswith("fact").any() and (events.event == "node_reached").any()


def test_a_sweep_folder_exports_with_its_points(tmp_path: Path) -> None:
    swept = run_cli(
        "-m",
        "hydra/launcher=batched",
        "engine=scripted",
        "narrator.temperature=0.2,0.6",
        "max_turns=3",
        "limit=3",
        "progress=false",
        "hydra.sweep.dir=sw",
        cwd=tmp_path,
    )
    assert swept.returncode == 0, swept.stderr
    res = run_cli("mode=export", "runs=[sw]", "export.format=parquet", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    eps = pd.read_parquet(tmp_path / "sw" / "parquet" / "episodes.parquet")
    assert sorted(set(eps.point)) == ["narrator.temperature=0.2", "narrator.temperature=0.6"]
    assert eps.groupby("point").size().to_dict() == {"narrator.temperature=0.2": 3, "narrator.temperature=0.6": 3}
    assert eps.label.nunique() == 2 and eps.run.nunique() == 2
    calls = analysis.calls(tmp_path / "sw")
    dirs = {tmp_path / str(r.run_dir) for r in read_index(tmp_path / "sw")}
    assert calls.point.notna().all() and len(calls) == sum(len(read_calls(d / "calls.jsonl")) for d in dirs)


def test_arrow_types_hold_for_an_empty_set() -> None:
    t = build_tables([])
    assert all(isinstance(v, pa.Table) and v.num_rows == 0 for v in t.values())
    assert t["turns"].schema.field("conflict_types").type == pa.list_(pa.string())
