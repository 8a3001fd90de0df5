"""audit.failure_modes (issue 38, part 2): the optional auditor stage that puts each standing
conflict into a failure mode, in the turn record, the re-audit and the report; off, nothing changes."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from helpers import Scripted, conflicts, make_spec, play_scripted_official, tag
from ncp_local.engines.base import Request
from ncp_local.protocol.stages import FAILURE_MODES, AuditIds, InvalidOutput, conflict_name, parse, schema_for
from ncp_local.report.parquet import build_tables
from ncp_local.report.runs import load_run
from ncp_local.report.table_rows import Source
from ncp_local.rundir.identity import settings

KEYS = AuditIds(conflict_keys=("fact:f_1", "player_input:input"))


def _modes(*entries: tuple[str, str]) -> str:
    return json.dumps({"modes": [{"conflict": c, "mode": m, "reason": "why"} for c, m in entries]})


def test_the_schema_offers_one_entry_per_standing_conflict_and_the_parser_checks_it() -> None:
    schema = schema_for("failure_mode", KEYS)["properties"]["modes"]
    assert [it["properties"]["conflict"]["const"] for it in schema["prefixItems"]] == list(KEYS.conflict_keys)
    assert schema["prefixItems"][0]["properties"]["mode"]["enum"] == list(FAILURE_MODES)
    # Any order and any case are read, and come back in the conflicts' order.
    out = parse("failure_mode", _modes(("player_input:input", "IGNORED_INPUT"), ("fact:f_1", "lost_continuity")), KEYS)
    assert [(m.conflict, m.mode) for m in out.modes] == [
        ("fact:f_1", "lost_continuity"),
        ("player_input:input", "ignored_input"),
    ]
    for bad, why in (
        (_modes(("fact:f_1", "other")), "modes must list each conflict once"),
        (_modes(("fact:f_1", "other"), ("fact:f_1", "other")), "modes must list each conflict once"),
        (_modes(("fact:f_1", "other"), ("fact:f_9", "other")), "modes must list each conflict once"),
        (_modes(("fact:f_1", "other"), ("player_input:input", "bad_luck")), "schema: modes/1/mode"),
    ):
        with pytest.raises(InvalidOutput, match=why):
            parse("failure_mode", bad, KEYS)


def _conflict_rules(mode_answer: str | None) -> Any:
    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage in ("conflict_check", "double_check") and turn == 1:
            extra = {"confirmed": True, "review_reason": "holds"} if stage == "double_check" else {}
            return conflicts([("fact", "f_0"), ("player_input", "input"), ("fact", "f_0")], **extra)
        if stage == "failure_mode":
            return mode_answer
        return None

    return rules


def test_a_standing_conflict_gets_its_mode_in_the_turn_record(tmp_path: Path) -> None:
    spec = make_spec()
    answer = _modes(("player_input:input", "yielded_to_player"), ("fact:f_0", "lost_continuity"))
    run = Scripted(tmp_path / "on", [spec], _conflict_rules(answer), max_turns=3, failure_modes=True)
    result = run.run()["tiny"]
    assert result.termination == "conflict" and len(result.turns) == 2
    last = result.turns[-1]
    # One entry per standing conflict, in their order; a repeated type and id is asked once.
    assert [m.mode for m in last.failure_modes] == ["lost_continuity", "yielded_to_player", "lost_continuity"]
    asked = run.requests("failure_mode")
    assert len(asked) == 1 and asked[0].tags["turn"] == 1
    listed = json.loads(
        "\n".join(m.content for m in asked[0].messages).split("with the text it names):\n")[1].split("\n\nYOUR TASK")[0]
    )
    assert [c["conflict"] for c in listed] == [conflict_name("fact", "f_0"), "player_input:input"]
    assert result.turns[0].failure_modes is None and "failure_modes" not in result.turns[0].model_dump()
    # The analysis tables' conflicts carry each one's mode.
    table = build_tables([Source(load_run(tmp_path / "on"))])["conflicts"].to_pandas()
    standing = table[table.standing]
    assert dict(zip(standing["id"], standing.failure_mode, strict=True)) == {
        "f_0": "lost_continuity",
        "input": "yielded_to_player",
    }
    # Off, the same episode: the same record without the key, and no call of the stage.
    off = Scripted(tmp_path / "off", [spec], _conflict_rules(answer), max_turns=3)
    off_result = off.run()["tiny"]
    assert not off.requests("failure_mode")
    on_dump = result.model_dump(mode="json")
    del on_dump["turns"][-1]["failure_modes"]
    assert on_dump == off_result.model_dump(mode="json")


def test_a_failed_mode_call_leaves_the_ending_as_it_was(tmp_path: Path) -> None:
    run = Scripted(tmp_path, [make_spec()], _conflict_rules("not json"), max_turns=3, failure_modes=True)
    result = run.run()["tiny"]
    assert result.termination == "conflict" and result.turns[-1].failure_modes is None
    assert len(run.requests("failure_mode")) > 1  # retried, then given up: the conflict still ends the story


def test_off_keeps_the_identity_settings_of_a_config_without_the_key() -> None:
    base: dict[str, Any] = {"seed": 0, "max_turns": 3, "prompts": {"dir": "x"}}
    assert settings({**base, "audit": {"failure_modes": False}}) == settings(base)
    assert settings({**base, "audit": {"failure_modes": True}}) != settings(base)
    assert settings(base)["prompts"] == {}  # a section emptied by NOT_IDENTITY keeps its place, as before


@pytest.fixture(scope="module")
def modes_run(official_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("modes") / "run"
    return play_scripted_official(official_dataset, out, "audit.failure_modes=true")


def _results(run: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((run / "results").glob("*.json"))}


def test_on_the_official_dataset_modes_change_nothing_else_and_reach_the_report(
    modes_run: Path, scripted_official_run: Path, tmp_path: Path
) -> None:
    on, off = _results(modes_run), _results(scripted_official_run)
    assert on.keys() == off.keys() and len(on) == 100
    expected: Counter[tuple[str, str]] = Counter()
    for sid, result in on.items():
        ended = result["termination"] == "conflict"
        for i, turn in enumerate(result["turns"]):
            modes = turn.pop("failure_modes", None)
            if ended and i == len(result["turns"]) - 1:
                assert [m["conflict"] for m in modes] == [conflict_name(c["type"], c["id"]) for c in turn["conflicts"]]
                expected.update((c["type"], m["mode"]) for c, m in zip(turn["conflicts"], modes, strict=True))
            else:
                assert modes is None, (sid, i)
        for key in ("identity", "seal"):
            result.pop(key, None)
            off[sid].pop(key, None)
        assert result == off[sid], sid
    assert sum(expected.values()) > 20 and len({m for _, m in expected}) == len(FAILURE_MODES)

    report = tmp_path / "report"
    done = run_cli("mode=report", f"runs=[{modes_run},{scripted_official_run}]", f"report.out={report}")
    assert done.returncode == 0, done.stderr
    with open(report / "failure_modes.csv") as f:
        rows = list(csv.DictReader(f))
    got = Counter({(r["conflict_type"], r["mode"]): int(r["conflicts"]) for r in rows if int(r["conflicts"])})
    assert got == expected and {r["run_dir"] for r in rows} == {str(modes_run)}
    md = (report / "results.md").read_text().split("## Failure modes")[1].split("## The auditor")[0]
    assert f"| audit.failure_modes=true | {sum(expected.values())} |" in md
    assert "audit.failure_modes=false: not asked" in md
    page = next((report / "episodes").glob("*/*.html"), None)
    assert page is not None
    conflict_pages = [
        p.read_text() for p in (report / "episodes").glob("*/*.html") if "failure mode</dt>" in p.read_text()
    ]
    assert len(conflict_pages) == sum(r["termination"] == "conflict" for r in on.values())


def test_reaudit_asks_the_modes_over_a_finished_run(
    modes_run: Path, scripted_official_run: Path, tmp_path: Path
) -> None:
    """The scripted re-auditor with the run's seed judges every turn as the run's auditor did, so its
    modes on the run made without them are the ones the run made with them gave."""
    out = tmp_path / "re"
    done = run_cli(
        "mode=reaudit",
        f"runs=[{scripted_official_run}]",
        "engine=scripted",
        "audit.failure_modes=true",
        f"out_dir={out}",
        "progress=false",
    )
    assert done.returncode == 0, done.stderr
    with open(out / "failure_modes.csv") as f:
        got = Counter({(r["conflict_type"], r["mode"]): int(r["conflicts"]) for r in csv.DictReader(f)})
    want: Counter[tuple[str, str]] = Counter()
    for result in _results(modes_run).values():
        if result["termination"] == "conflict":
            last = result["turns"][-1]
            want.update((c["type"], m["mode"]) for c, m in zip(last["conflicts"], last["failure_modes"], strict=True))
    assert +got == want
