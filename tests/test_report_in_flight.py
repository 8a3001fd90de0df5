"""mode=report on a run in flight (issue 60 item 4): finished episodes as usual, each episode with a
checkpoint and no result censored at its last committed turn in S(t), turns kept and the endings, one
line saying how many; a run with nothing yet said so; a checkpoint that fails its check skipped."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from cli_runner import CliResult, run_cli
from ncp_local.protocol.metrics import km_survival, restricted_mean
from ncp_local.report.in_flight import count_in_flight
from ncp_local.report.runs import load_run

# Our three specs, three trials each, four at a time: the engine dies after 200 calls with five
# episodes finished and four checkpointed (the scripted engine's answers follow the seed).
RUN = ("engine=scripted", "trials.count=3", "concurrency=4", "max_turns=8", "progress=false")
LINE = "4 of 9 episodes still playing or stopped (counted as censored at their last committed turn)"


def _report(out: Path, *runs: Path) -> CliResult:
    return run_cli("mode=report", f"runs=[{','.join(map(str, runs))}]", f"report.out={out}", "report.resamples=200")


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("inflight") / "run"
    died = run_cli(*RUN, f"out_dir={out}", "engine.die_after_calls=200")
    assert died.returncode == 3, died.stderr
    assert len(list((out / "results").glob("*.json"))) == 5
    assert len(list((out / "checkpoints").glob("*.jsonl"))) == 4
    return out


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def _turns(run: Path) -> tuple[list[int], list[bool]]:
    """Each scored episode's turns and whether it is censored, read from the files themselves:
    a result's turn records (censored when the window stopped it), a checkpoint's committed turns."""
    turns, censored = [], []
    for f in sorted((run / "results").glob("*.json")):
        data = json.loads(f.read_text(encoding="utf-8"))
        if data["termination"] != "invalid":
            turns.append(len(data["turns"]))
            censored.append(data["termination"] == "context_limit")
    for f in sorted((run / "checkpoints").glob("*.jsonl")):
        turns.append(len(f.read_bytes().splitlines()) - 1)  # a turn log: line 1 the opening, then a turn each
        censored.append(True)
    return turns, censored


def test_a_stopped_run_is_reported_with_its_episodes_in_flight_censored(stopped: Path, tmp_path: Path) -> None:
    rep = _report(tmp_path / "rep", stopped)
    assert rep.returncode == 0, rep.stderr
    assert LINE in rep.stdout
    assert "left out" not in rep.stdout.replace("`invalid` left out", "")  # counted now, not left out
    assert LINE in (tmp_path / "rep" / "results.md").read_text(encoding="utf-8")
    assert LINE in (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    svg = (tmp_path / "rep" / "survival.svg").read_text(encoding="utf-8")
    assert "+4 in flight)" in svg and "(+: context_limit or in flight)" in svg

    # The results table's counts and averages are over the 5 finished episodes.
    (row,) = _csv(tmp_path / "rep" / "results.csv")
    assert row["episodes"] == "5" and row["unfinished"] == "4"
    finished = [len(json.loads(f.read_text())["turns"]) for f in (stopped / "results").glob("*.json")]
    assert float(row["avg_turns"]) == pytest.approx(sum(finished) / 5, abs=1e-6)

    # S(t) and turns kept: Kaplan-Meier over the 9, the 4 in flight censored at their committed turns.
    turns, censored = _turns(stopped)
    assert sum(censored) >= 4 and len(turns) == 9
    expected = km_survival(turns, censored, 8).s
    rows = _csv(tmp_path / "rep" / "survival.csv")
    label = next(
        k
        for k in rows[0]
        if k not in ("turns_played",) and not k.endswith((" lo", " hi", "context_limit", "in_flight"))
    )
    assert [float(r[label]) for r in rows] == pytest.approx(expected, abs=1e-6)
    assert sum(int(r[f"{label} in_flight"]) for r in rows) == 4
    kept = restricted_mean(turns, censored, 8, resamples=10).value
    assert float(row["turns_kept"]) == pytest.approx(kept, abs=1e-6)
    # Without the in-flight ones S(t) would differ: the test tells the two apart.
    assert km_survival(turns[:5], censored[:5], 8).s != pytest.approx(expected, abs=1e-6)

    # The endings rest on the 9 (Aalen-Johansen, the 4 censored): their curves and S(t) add up.
    ends = _csv(tmp_path / "rep" / "endings.csv")
    for r in ends:
        parts = [float(r[k]) for k in r if k.startswith("incidence_") and not k.endswith(("_lo", "_hi"))]
        t = int(r["turns_played"])
        if t <= 8:
            assert sum(parts) + float(r["survival"]) == pytest.approx(1.0, abs=1e-6)
    assert "| 9 |" in rep.stdout.split("what ended each story:")[1].split("###")[0]


def test_the_same_report_after_the_run_finishes_has_no_line(stopped: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    assert run_cli(*RUN, f"out_dir={run}").returncode == 0
    rep = _report(tmp_path / "rep", run)
    assert rep.returncode == 0, rep.stderr
    assert "still playing" not in rep.stdout
    assert "in_flight" not in (tmp_path / "rep" / "survival.csv").read_text(encoding="utf-8")
    assert "in-flight" not in (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    (row,) = _csv(tmp_path / "rep" / "results.csv")
    assert row["episodes"] == "9" and row["unfinished"] == "0"


def test_a_checkpoint_that_fails_its_check_is_skipped_with_a_note(stopped: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    torn = sorted((run / "checkpoints").glob("*.jsonl"))[0]
    torn.write_bytes(torn.read_bytes()[:100])  # line 1 cut short: nothing of the log can be read
    rep = _report(tmp_path / "rep", run)
    assert rep.returncode == 0, rep.stderr
    assert "3 of 8 episodes still playing" in rep.stdout
    assert f"{torn}: line 1: cut short (a crash mid-write): skipped" in rep.stdout
    assert torn.read_bytes()  # nothing moved or removed: the report never writes into a run


def test_a_checkpoint_gone_between_listing_and_reading_is_noted(stopped: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    loaded = load_run(run)
    gone = sorted((run / "checkpoints").glob("*.jsonl"))[0]
    gone.unlink()  # the episode finished (or was quarantined) while the report read the run
    count_in_flight(loaded)
    assert len(loaded.in_flight) == 3
    assert any(n.startswith(f"{gone.stem}: its checkpoint went away") for n in loaded.notes)


def test_a_run_with_nothing_yet_is_said_so(stopped: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    shutil.copytree(stopped, empty)
    for f in [*(empty / "results").glob("*.json"), *(empty / "checkpoints").glob("*.jsonl")]:
        f.unlink()
    alone = _report(tmp_path / "rep-alone", empty)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.strip() == f"{empty}: no episode has finished or committed a turn yet: nothing to report"
    assert not (tmp_path / "rep-alone").exists()
    # Beside a run with something, it is left out of the report and said so.
    both = _report(tmp_path / "rep-both", empty, stopped)
    assert both.returncode == 0, both.stderr
    assert f"{empty}: no episode has finished or committed a turn yet: nothing to report (left out" in both.stdout
    assert LINE in both.stdout


def test_an_inspect_export_of_a_run_in_flight_is_a_started_log_rewritten_in_place(
    stopped: Path, tmp_path: Path
) -> None:
    pytest.importorskip("inspect_ai")
    from inspect_ai.log import read_eval_log

    out = tmp_path / "inspect"
    for _ in range(2):  # exporting again rewrites the same file
        done = run_cli("mode=export", "export.format=inspect", f"runs=[{stopped}]", f"export.out={out}")
        assert done.returncode == 0, done.stderr
    (log_file,) = out.glob("*.eval")
    log = read_eval_log(str(log_file))
    assert log.status == "started"
    assert len(log.samples or []) == len(list((stopped / "results").glob("*.json"))) == 5


def test_a_run_with_nothing_finished_shows_no_figure_past_the_data(tmp_path: Path) -> None:
    # Killed after 40 calls: four episodes in flight at a turn or two, none finished. Turns kept to the cap and
    # the endings at the turn limit are not estimable (bounds, labelled), S(t) has no point past the turn after
    # the last followed, and the report says nothing has finished.
    run = tmp_path / "run"
    died = run_cli(*RUN, f"out_dir={run}", "engine.die_after_calls=40")
    assert died.returncode == 3, died.stderr
    assert not list((run / "results").glob("*.json")) and list((run / "checkpoints").glob("*.jsonl"))
    rep = _report(tmp_path / "rep", run)
    assert rep.returncode == 0, rep.stderr
    assert "nothing has finished yet: 4 episodes still playing or stopped" in rep.stdout
    (row,) = _csv(tmp_path / "rep" / "results.csv")
    assert row["turns_kept"] == "" and float(row["turns_kept_hi"]) == 8.0
    assert "| n/e [" in rep.stdout.split("what ended each story:")[0] and "turns kept n/e (not estimable)" in rep.stdout
    assert "n/e (not estimable) at the turn limit" in rep.stdout.split("what ended each story:")[1]
    rows = _csv(tmp_path / "rep" / "survival.csv")
    label = next(k for k in rows[0] if k != "turns_played" and not k.endswith((" lo", " hi", "limit", "flight")))
    assert rows[-1][label] == "" and float(rows[0][label]) == 1.0
