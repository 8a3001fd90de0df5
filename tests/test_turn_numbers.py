"""One turn numbering for people (protocol/turns.py): records keep the reference's turn ids (opening -1,
first player turn 0); the HTML, the review sheet, the plan and the survival CSV count as the paper does
("turn N" = the N-th player turn). Pinned on one episode that ends by a conflict at a known turn."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from helpers import Scripted, conflicts, make_spec, spec_doc, statuses, tag, traj
from ncp_local import config as config_mod
from ncp_local import plan as plan_mod
from ncp_local.engines.base import Request
from ncp_local.modes.plan import full as plan_full
from ncp_local.protocol import turns
from ncp_local.report import build_report
from ncp_local.report.review import export_sheet
from ncp_local.report.runs import attach_specs, load_run

ENDS_AT_ID = 2  # the record's turn id of the conflict: the paper's turn 3
MAX_TURNS = 5


def rules(req: Request) -> str | None:
    """`ends`: a confirmed fact conflict at turn id 2; `runs`: nothing happens, it plays all 5 turns."""
    stage, ep, turn, _ = tag(req)
    if stage in ("conflict_check", "double_check"):
        extra = {"confirmed": True, "review_reason": "confirmed"} if stage == "double_check" else {}
        return conflicts([("fact", "f_0")] if (ep, turn) == ("ends", ENDS_AT_ID) else [], **extra)
    if stage == "trajectory_check":
        return traj(ep == "ends" and turn == 0)  # a node completed at turn id 0: "turn 1" to a person
    if stage == "status_check":
        return statuses(req, set())
    return None


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("turns")
    dataset = base / "dataset"
    (dataset / "specs").mkdir(parents=True)
    (dataset / "index.yaml").write_text(yaml.safe_dump({"specs": ["ends", "runs"]}))
    for sid in ("ends", "runs"):
        (dataset / "specs" / f"{sid}.yaml").write_text(yaml.safe_dump(spec_doc(sid), sort_keys=False))
    root = base / "run"
    Scripted(root, [make_spec("ends"), make_spec("runs")], rules=rules, max_turns=MAX_TURNS).run()
    manifest = json.loads((root / "manifest.json").read_text())
    manifest.update(
        {
            "dataset": {"path": str(dataset), "specs": ["ends", "runs"]},
            "config": {
                "engine": {"name": "scripted"},
                "max_turns": MAX_TURNS,
                "condition": {"name": "adversarial"},
                "method": {"name": "baseline"},
            },
        }
    )
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_the_conversion() -> None:
    assert [turns.label(t) for t in (-1, 0, 1, 2)] == ["opening", "turn 1", "turn 2", "turn 3"]
    assert [turns.shown(t) for t in (-1, 0, 2)] == [0, 1, 3] and turns.id_of(3) == 2
    assert turns.at(-1) == "at the opening" and turns.at(2) == "at turn 3"


def test_record_html_survival_review_and_plan_agree(run_dir: Path, tmp_path: Path) -> None:
    # The record: the reference's turn ids, the opening -1 in the call log.
    record = json.loads((run_dir / "results" / "ends.json").read_text())
    assert record["termination"] == "conflict" and [t["turn"] for t in record["turns"]] == [0, 1, ENDS_AT_ID]
    calls = [json.loads(line) for line in (run_dir / "calls.jsonl").read_text().splitlines()]
    assert {c["turn"] for c in calls if c["stage"] == "opening"} == {-1}

    run = load_run(run_dir)
    attach_specs(run)
    assert run.label.startswith("scripted / scripted")  # no model ran: never labelled as one
    out = tmp_path / "report"
    build_report([run], out, resamples=200)

    # The HTML: the paper's count everywhere, the opening before turn 1.
    page = next((out / "episodes").glob("*/ends.html")).read_text()
    assert re.search(r'Ended by a fact conflict at <a href="#t3">turn 3 ', page)
    cards = re.findall(r'<article class="card turn[^"]*" id="([^"]+)"><h3>([^<]+)</h3>', page)
    assert cards == [("opening", "Opening"), ("t1", "Turn 1"), ("t2", "Turn 2"), ("t3", "Turn 3")]
    assert "<b>Conflict</b> at turn 3:" in page and "Turn 0" not in page
    assert re.search(r"<td>node 0 description</td>.*?<td>turn 1</td>", page)  # completed at turn id 0

    # The survival CSV: t = turns played. `ends` played 3 turns: in S(3), gone after t = 3.
    rows = list(csv.DictReader(io.StringIO((out / "survival.csv").read_text())))
    assert [int(r["turns_played"]) for r in rows] == list(range(MAX_TURNS + 1))
    assert [float(r[run.label]) for r in rows] == pytest.approx([1, 1, 1, 1, 0.5, 0.5])

    # The review sheet: the conflict's turn as people count it.
    sheet, _, n = export_sheet([run], tmp_path / "review", n=5, seed=0)
    [item] = list(csv.DictReader(io.StringIO(sheet.read_text())))
    assert n == 1 and item["spec_id"] == "ends" and item["turn"] == "3"

    # The plan, fitted from this run's call log: turn id t is the plan's turn t + 1, the opening 0.
    raw = OmegaConf.to_container(config_mod.compose([f"plan.measured={run_dir}", "max_turns=3"]), resolve=True)
    plan = plan_full(config_mod.validate(raw))  # type: ignore[arg-type]
    assert plan.growth is not None
    assert plan.growth.stages["opening"].turns == (0,)
    assert plan.growth.stages["narrate"].turns == tuple(range(1, MAX_TURNS + 1))
    assert plan.growth.stages["double_check"].turns == (3,)  # only `ends` had its conflict double-checked
    table = [line for line in plan_mod.render(plan) if line.startswith("| ")]
    header = [c.strip() for c in table[0].split("|")[1:-1]]
    assert header[6:9] == ["opening", "turn 1", "turn 3"] and "turn 0" not in header
    rows = {
        cells[0]: dict(zip(header, cells, strict=True))
        for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in table[2:])
    }
    assert rows["opening"]["opening"] != "-" and rows["opening"]["turn 1"] == "-"
    assert rows["double_check"]["opening"] == "-" and rows["double_check"]["turn 3"] != "-"
