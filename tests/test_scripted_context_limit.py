"""Censoring by context without a model: the scripted engine's `engine.context_limit_turn` (fault
injection) ends the chosen episodes `context_limit` at the chosen turn, and the whole path agrees on
what was censored: the run's results, the report (main table, genres, S(t) with its marks, endings),
and the exports (the analysis tables, Inspect's log)."""

from __future__ import annotations

import asyncio
import csv
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.engines.base import ContextOverflow, Request
from ncp_local.engines.scripted import Overflow, ScriptedEngine
from ncp_local.protocol.trials import episode_name
from ncp_local.report.runs import attach_specs, load_run

TURN = 3  # the player turn whose calls no longer fit: the chosen episodes end with 2 committed turns
MAX_TURNS = 6
SETTINGS = (
    "engine=scripted",
    f"max_turns={MAX_TURNS}",
    "trials.count=4",
    "progress=false",
    f"engine.context_limit_turn={TURN}",
    "engine.context_limit_share=0.5",
)


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _request(episode: str, turn: int) -> Request:
    tags = {"stage": "narrate", "episode": episode, "turn": turn, "attempt": 0}
    return Request(messages=[], temperature=0.6, top_p=0.95, max_tokens=64, seed=0, tags=tags)


def test_overflow_hits_the_chosen_episodes_from_its_turn_on() -> None:
    every = Overflow(turn=2)
    assert not every.hits(_request("a", 0))  # player turn 1 (turn id 0) still fits
    assert every.hits(_request("a", 1)) and every.hits(_request("a", 5))
    assert not every.hits(_request("a", -1))  # nor does the opening ever overflow from turn 2 on
    names = [f"s{i}" for i in range(200)]
    half = Overflow(turn=1, share=0.5)
    chosen = {n for n in names if half.chosen(n)}
    assert 70 < len(chosen) < 130  # about half, by name: the same ones on every call
    assert chosen == {n for n in names if Overflow(turn=4, share=0.5).chosen(n)}
    assert not any(Overflow(turn=1, share=0.0).chosen(n) for n in names)

    engine = ScriptedEngine(overflow=Overflow(turn=1))
    with pytest.raises(ContextOverflow, match="fault injection"):
        asyncio.run(engine.generate(_request("a", 0)))


@pytest.fixture(scope="module")
def censored_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run directory, report folder) of the local specs played with the window filling at turn 3."""
    base = tmp_path_factory.mktemp("scripted-context-limit")
    run = run_cli(*SETTINGS, f"out_dir={base / 'run'}")
    assert run.returncode == 0, run.stderr
    rep = run_cli("mode=report", f"runs=[{base / 'run'}]", f"report.out={base / 'report'}", "report.resamples=200")
    assert rep.returncode == 0, rep.stderr
    return base / "run", base / "report"


def test_the_chosen_episodes_end_context_limit_at_the_chosen_turn(censored_run: tuple[Path, Path]) -> None:
    run = load_run(censored_run[0])
    share = Overflow(TURN, 0.5)
    stopped = {name for name, r in run.results.items() if r.termination == "context_limit"}
    assert stopped  # the window filled for some episodes
    for name, r in run.results.items():
        assert name == episode_name(r.spec_id, r.trial)
        if not share.chosen(name):
            assert r.termination != "context_limit", name
        elif r.termination == "context_limit":
            # Its calls of turn 3 no longer fit: 2 committed turns, the third under way.
            assert len(r.turns) == TURN - 1 and "fault injection" in r.reason, name
        else:  # the story ended before the window filled
            assert r.termination in ("conflict", "all_resolved") and len(r.turns) < TURN, name


def test_report_and_exports_agree_on_what_was_censored(censored_run: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, report = censored_run
    run = load_run(run_dir)
    ends = [r.termination for r in run.results.values()]
    n_context, n_turns = ends.count("context_limit"), ends.count("max_turns")
    label = run.label

    # The main table: `context_limit` counts the window's stops; `censored` both stops (glossary).
    [row] = _csv(report / "results.csv")
    assert (int(row["context_limit"]), int(row["max_turns"])) == (n_context, n_turns)
    assert int(row["censored"]) == n_context + n_turns
    assert row["engine"] == "scripted" and row["narrator_model"] == "scripted"
    # The genre table counts the same stops under each genre of their story.
    genres = _csv(report / "genres.csv")
    assert "censored" not in genres[0]
    attach_specs(run)
    assert sum(int(g["context_limit"]) for g in genres) == sum(
        len(run.genres(r.spec_id)) for r in run.results.values() if r.termination == "context_limit"
    )
    # S(t): each stopped episode leaves the count after t = TURN (2 turns committed, the third under way).
    surv = _csv(report / "survival.csv")
    marks = [int(r[f"{label} context_limit"]) for r in surv]
    assert marks[TURN] == n_context and sum(marks) == n_context
    assert "(+: context_limit)" in (report / "survival.svg").read_text()
    # The endings table: context_limit and max_turns both censored, as in the glossary.
    md = (report / "results.md").read_text()
    assert f"| {n_turns} | {n_context} |" in md  # max_turns (censored), context_limit (censored)
    assert "Scripted engine: no model ran" in md and f"{label}: {run.path}; engine scripted" in md
    index = (report / "index.html").read_text()
    assert f"{n_context} context_limit</div>" in index

    # The exports: the analysis tables and Inspect's log say the same.
    tables = tmp_path / "tables"
    res = run_cli("mode=export", f"runs=[{run_dir}]", "export.format=parquet", f"export.out={tables}")
    assert res.returncode == 0, res.stderr
    pq = pytest.importorskip("pyarrow.parquet")
    eps = pq.read_table(tables / "episodes.parquet").to_pylist()
    assert sum(e["termination"] == "context_limit" for e in eps) == n_context
    assert sum(e["censored"] for e in eps) == n_context + n_turns
    assert all(e["turns"] == TURN - 1 for e in eps if e["termination"] == "context_limit")


def test_inspect_log_names_the_same_censored_episodes(censored_run: tuple[Path, Path], tmp_path: Path) -> None:
    inspect_log = pytest.importorskip("inspect_ai.log", reason="inspect_ai is not installed (the `inspect` extra)")
    run_dir, _ = censored_run
    run = load_run(run_dir)
    res = run_cli("mode=export", f"runs=[{run_dir}]", "export.format=inspect", f"export.out={tmp_path}")
    assert res.returncode == 0, res.stderr
    [path] = list(tmp_path.rglob("*.eval"))
    samples = inspect_log.read_eval_log(str(path)).samples or []
    assert len(samples) == len(run.results)  # a sample per story and epoch (epoch = trial + 1)
    # `censored` as in the glossary: the window's stops and the turn cap's.
    stopped = {
        (r.spec_id, r.trial + 1) for r in run.results.values() if r.termination in ("context_limit", "max_turns")
    }
    marked = {(str(s.id), s.epoch) for s in samples if s.metadata["censored"]}
    assert stopped and marked == stopped
