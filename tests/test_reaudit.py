"""mode=reaudit: judge a finished run's turns again, without new narration."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from cli_runner import CliResult, run_cli
from helpers import Scripted, first_check, make_spec, tag
from ncp_local.engines.base import Request
from ncp_local.engines.scripted import RandomPolicy, ScriptedEngine
from ncp_local.errors import InputError
from ncp_local.execution.calls import CallService, RoleBinding, Sampling
from ncp_local.modes.reaudit import ReauditResult, TurnAudit, agreement, reaudit_all
from ncp_local.protocol.metrics import OVERRULED
from ncp_local.protocol.prompts import PromptPack
from ncp_local.protocol.records import EpisodeResult, FactUpdateRecord, TurnRecord
from ncp_local.report.reaudit_runs import reaudit_run
from ncp_local.report.runs import load_run
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.store import RunDir

ROOT = Path(__file__).resolve().parent.parent
POLICY = RandomPolicy(conflict_rate=0.25, overturn_rate=0.3, node_rate=0.4, satisfy_rate=0.3)
SPECS = [make_spec(f"s{i}", n_facts=4, n_nodes=4) for i in range(8)]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Scripted, dict[str, EpisodeResult]]:
    s = Scripted(tmp_path_factory.mktemp("src") / "run", SPECS, policy=POLICY, max_turns=8, seed=11)
    return s, s.run()


def reaudit(
    tmp: Path, results: dict[str, EpisodeResult], policy: RandomPolicy, seed: int = 11, rules: Any = None
) -> tuple[dict[str, ReauditResult], ScriptedEngine, RunDir]:
    backend = ScriptedEngine(rules=rules, policy=policy)
    store = RunDir(tmp)
    store.open({"kind": "reaudit"}, identity="re")
    calls = CallService(
        roles={"auditor": RoleBinding(backend, Sampling(), "re")}, pack=PromptPack.load(), store=store, seed=seed
    )
    try:
        out = asyncio.run(reaudit_all([(s, results[s.id]) for s in SPECS], calls, concurrency=16))
    finally:
        store.close()
    return out, backend, store


def pairs(results: dict[str, EpisodeResult], re: dict[str, ReauditResult]) -> list[tuple[EpisodeResult, ReauditResult]]:
    return [(results[s.id], re[s.id]) for s in SPECS]


def test_identical_auditor_agrees_fully(source: tuple[Scripted, dict[str, EpisodeResult]], tmp_path: Path) -> None:
    src, results = source
    assert sum(r.termination == "conflict" for r in results.values()) >= 2  # something to agree on
    re, backend, store = reaudit(tmp_path / "re", results, POLICY)
    # Every recorded turn judged, no narration, no player, no trajectory or status check.
    assert {r.tags["stage"] for r in backend.requests} <= {"fact_update", "conflict_check", "double_check"}
    assert sum(len(r.turns) for r in re.values()) == sum(len(r.turns) for r in results.values())
    # The state before each turn is the original's: the auditor's prompts are byte-identical.
    for stage in ("fact_update", "conflict_check", "double_check"):
        orig = {tag(r)[1:3]: r.messages for r in src.requests(stage) if r.tags["turn"] >= 0 and r.tags["attempt"] == 0}
        again = {tag(r)[1:3]: r.messages for r in backend.requests if r.tags["stage"] == stage}
        assert again == orig, stage
    agr = agreement(pairs(results, re))
    assert agr["per_turn"]["conflict"]["kappa"] == 1.0
    assert agr["per_turn"]["conflict"]["yes_no"] == agr["per_turn"]["conflict"]["no_yes"] == 0
    for t in ("fact", "commitment", "player_input", "conflict_first_check"):
        k = agr["per_turn"][t]["kappa"]
        assert k == 1.0 or math.isnan(k)
        assert agr["per_turn"][t]["agree"] == 1.0
    for m in agr["per_episode"].values():
        assert m["original"] == m["reaudit"]
    assert agr["per_episode"]["turns"]["pearson"] == pytest.approx(1.0)
    assert agr["per_episode"]["turns"]["spearman"] == pytest.approx(1.0)
    calls = read_calls(store.calls_path)  # the runner's call log, with seeds
    assert len(calls) == len(backend.requests) and all(c.seed >= 0 for c in calls)


def test_other_policy_disagrees(source: tuple[Scripted, dict[str, EpisodeResult]], tmp_path: Path) -> None:
    _, results = source
    strict = RandomPolicy(conflict_rate=0.7, overturn_rate=0.1)
    re, _, _ = reaudit(tmp_path / "re", results, strict, seed=99)
    agr = agreement(pairs(results, re))
    assert agr["per_turn"]["conflict"]["kappa"] < 1.0
    assert agr["per_turn"]["conflict"]["no_yes"] > 0  # the strict auditor flags turns the original passed
    assert agr["per_episode"]["turns"]["reaudit"] < agr["per_episode"]["turns"]["original"]


def test_failed_turn_is_left_out(source: tuple[Scripted, dict[str, EpisodeResult]], tmp_path: Path) -> None:
    _, results = source
    victim = next(s.id for s in SPECS if len(results[s.id].turns) >= 2)

    def broken(req: Request) -> str | None:
        stage, ep, turn, _ = tag(req)
        return "{bad" if (stage == "conflict_check" and ep == victim and turn == 0) else None

    re, _, _ = reaudit(tmp_path / "re", results, POLICY, rules=broken)
    bad = [a for a in re[victim].turns if a.error]
    assert [a.turn for a in bad] == [0] and "invalid after 3 attempts" in bad[0].error
    agr = agreement(pairs(results, re))
    assert agr["failed_turns"] == 1
    assert agr["turns"] == sum(len(r.turns) for r in results.values()) - 1
    assert victim not in {r["spec_id"] for r in agr["episode_rows"]}


def _rec(turn: int, standing: list[tuple[str, str]] = (), first: list[tuple[str, str]] | None = None) -> TurnRecord:
    fu = FactUpdateRecord(add_facts=(), negate_facts=(), reason="")
    first = list(standing) if first is None else first
    return TurnRecord(
        turn=turn,
        player_input="p",
        response="r",
        fact_update=fu,
        conflict_check=first_check(first),
        double_check=None,
        conflicts=tuple({"type": t, "id": i, "reason": ""} for t, i in standing),
    )


def _episode(sid: str, turns: list[TurnRecord], termination: str) -> EpisodeResult:
    from ncp_local.protocol import ledger

    spec = make_spec(sid)
    fu = FactUpdateRecord(add_facts=(), negate_facts=(), reason="")
    return EpisodeResult(
        spec_id=sid,
        termination=termination,
        opening="o",
        opening_update=fu,
        turns=tuple(turns),
        final_state=ledger.initial_state(spec),
        max_turns=4,
    )


def _audit(sid: str, standing: list[list[tuple[str, str]]]) -> ReauditResult:
    return ReauditResult(
        spec_id=sid,
        source_termination="",
        turns=tuple(
            TurnAudit(
                turn=t,
                conflict_check=first_check(s),
                conflicts=tuple({"type": ty, "id": i, "reason": ""} for ty, i in s),
            )
            for t, s in enumerate(standing)
        ),
    )


def test_agreement_by_hand() -> None:
    # x: original fact conflict at turn 2; the re-auditor flags a player-input conflict at turn 1 already.
    # y: original ran to max_turns (4 turns); the re-auditor agrees there is no conflict.
    x = _episode("x", [_rec(0), _rec(1), _rec(2, [("fact", "f_0")])], "conflict")
    y = _episode("y", [_rec(t) for t in range(4)], "max_turns")
    rx = _audit("x", [[], [("player_input", "player_input")], [("fact", "f_0")]])
    ry = _audit("y", [[], [], [], []])
    agr = agreement([(x, rx), (y, ry)])
    c = agr["per_turn"]["conflict"]
    # 7 turns: both yes 1 (x2), re only 1 (x1), both no 5. p_o = 6/7, p_e = (1/7)(2/7) + (6/7)(5/7) = 32/49.
    assert (c["yes_yes"], c["yes_no"], c["no_yes"], c["no_no"]) == (1, 0, 1, 5)
    assert c["kappa"] == pytest.approx((6 / 7 - 32 / 49) / (1 - 32 / 49))
    assert agr["per_turn"]["fact"]["kappa"] == 1.0
    rows = {r["spec_id"]: r for r in agr["episode_rows"]}
    assert (rows["x"]["turns_original"], rows["x"]["turns_reaudit"]) == (3, 2)
    assert (rows["y"]["turns_original"], rows["y"]["turns_reaudit"]) == (4, 4)  # censored at the recorded length
    assert (rows["x"]["fact_original"], rows["x"]["fact_reaudit"], rows["x"]["player_input_reaudit"]) == (1, 0, 1)
    assert agr["per_episode"]["turns"]["original"] == 3.5 and agr["per_episode"]["turns"]["reaudit"] == 3
    assert agr["per_episode"]["turns"]["pearson"] == pytest.approx(1.0)


def _run(*args: str, cwd: Path) -> CliResult:
    return run_cli(*args, cwd=cwd)


def test_cli_reaudit(tmp_path: Path) -> None:
    src = tmp_path / "src"
    assert (
        _run(
            "engine=scripted",
            "max_turns=6",
            f"out_dir={src}",
            "progress=false",
            "engine.conflict_rate=0.3",
            cwd=tmp_path,
        ).returncode
        == 0
    )
    same = _run(
        "mode=reaudit",
        f"runs=[{src}]",
        "engine=scripted",
        "engine.conflict_rate=0.3",
        f"out_dir={tmp_path / 'same'}",
        cwd=tmp_path,
    )
    assert same.returncode == 0, same.stderr
    agr = json.loads((tmp_path / "same" / "agreement.json").read_text())
    assert agr["per_turn"]["conflict"]["kappa"] == 1.0
    manifest = json.loads((tmp_path / "same" / "manifest.json").read_text())
    assert manifest["kind"] == "reaudit" and manifest["source"]["path"] == str(src.resolve())
    for name in ("agreement.md", "agreement_turns.csv", "agreement_episodes.csv", "calls.jsonl", "DONE"):
        assert (tmp_path / "same" / name).exists(), name
    assert len(list((tmp_path / "same" / "results").glob("*.json"))) == 3
    assert "| conflict (after double-check) | 1.000 |" in same.stdout
    # The scripted engine judged: the re-auditor is labelled so, never by the model its config names.
    assert "re-auditor: scripted (seed 0)" in (tmp_path / "same" / "agreement.md").read_text()
    assert "smollm2" not in (tmp_path / "same" / "agreement.md").read_text() + same.stdout

    again = _run(
        "mode=reaudit",
        f"runs=[{src}]",
        "engine=scripted",
        "engine.conflict_rate=0.3",
        f"out_dir={tmp_path / 'same'}",
        cwd=tmp_path,
    )
    assert again.returncode == 0 and "nothing left to do" in again.stdout

    other = _run(
        "mode=reaudit",
        f"runs=[{src}]",
        "engine=scripted",
        "engine.conflict_rate=0.8",
        "seed=5",
        f"out_dir={tmp_path / 'other'}",
        cwd=tmp_path,
    )
    assert other.returncode == 0, other.stderr
    assert json.loads((tmp_path / "other" / "agreement.json").read_text())["per_turn"]["conflict"]["kappa"] < 1.0

    # Without out_dir the re-audit lands beside its source run, whatever directory it was started from.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    beside = _run("mode=reaudit", f"runs=[{src}]", "engine=scripted", cwd=elsewhere)
    assert beside.returncode == 0, beside.stderr
    landed = [p.name for p in tmp_path.glob("reaudit-*") if (p / "DONE").exists()]
    assert len(landed) == 1, sorted(p.name for p in tmp_path.iterdir())
    assert not list(elsewhere.iterdir())  # nothing written into the working directory

    into_source = _run("mode=reaudit", f"runs=[{src}]", "engine=scripted", f"out_dir={src}", cwd=tmp_path)
    assert into_source.returncode == 2 and "another config" in into_source.stderr  # never writes into the run
    with pytest.raises(InputError, match="re-audit directory"):  # mode=report refuses it: not a run
        load_run(tmp_path / "same")

    # An unfinished episode (checkpoint, no result) is not judged: the re-audit and the review sheet say so.
    part = tmp_path / "part"
    shutil.copytree(src, part)
    first = sorted((part / "results").glob("*.json"))[0]
    (part / "checkpoints").mkdir(exist_ok=True)
    first.rename(part / "checkpoints" / first.name)
    partial = _run("mode=reaudit", f"runs=[{part}]", "engine=scripted", f"out_dir={tmp_path / 'partial'}", cwd=tmp_path)
    assert partial.returncode == 0, partial.stderr
    assert "note: " in partial.stdout and "1 episode(s) unfinished (checkpoint, no result): left out" in partial.stdout
    assert len(list((tmp_path / "partial" / "results").glob("*.json"))) == 2
    sheet = _run("mode=review", f"runs=[{part}]", f"review.out={tmp_path / 'sheet'}", cwd=tmp_path)
    assert sheet.returncode == 0, sheet.stderr
    assert "1 episode(s) unfinished" in sheet.stdout


def test_a_conflict_the_reauditor_does_not_uphold_is_overruled_not_context_limit(tmp_path: Path) -> None:
    # A re-auditor that finds no conflict leaves every play the source's auditor ended censored where it
    # stood: named `overruled` (report/reaudit_runs.py), never the window's `context_limit`.
    src, lax = tmp_path / "src", tmp_path / "lax"
    done = _run("engine=scripted", "max_turns=6", f"out_dir={src}", "engine.conflict_rate=0.5", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    done = _run(
        "mode=reaudit", f"runs=[{src}]", "engine=scripted", "engine.conflict_rate=0", f"out_dir={lax}", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    ended = {m.spec_id for m in load_run(src).metrics() if m.termination == "conflict"}
    judged = {m.spec_id: m.termination for m in reaudit_run(lax).metrics()}
    assert ended and {judged[s] for s in ended} == {OVERRULED}
    assert "context_limit" not in judged.values()
