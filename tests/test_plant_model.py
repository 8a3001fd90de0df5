"""mode=plant's planting model (plant.model: a rewrite checked, or the fixed edit in its place) and the
auditor's misses folded back into a run's report (report/misses.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cli_runner import run_cli
from ncp_local.engines.base import Request
from ncp_local.engines.scripted import PlantJudge, RandomPolicy, ScriptedEngine
from ncp_local.execution.calls import CallService, RoleBinding, Sampling
from ncp_local.modes.plant import judge_all
from ncp_local.protocol.plant import CLEAN, check_rewrite, rewrite_key
from ncp_local.protocol.prompts import TEMPLATES, PromptPack
from ncp_local.protocol.stages import CONFLICT_TYPES
from ncp_local.report.misses import Measured, correct, corrected_rates, misses_section
from ncp_local.report.plant_dirs import load_plant_dir
from ncp_local.report.plants import measure
from ncp_local.report.plants_doc import marked
from ncp_local.report.runs import Run
from ncp_local.rundir.store import RunDir
from test_plant import SCRIPTED, _items, planted_run


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return planted_run(tmp_path_factory)


def test_a_planting_models_rewrite_is_checked() -> None:
    played = "You step into the hall. The lamps flicker. A door creaks somewhere above you."
    fact = "The east door of the hall is locked."
    woven = "You step into the hall. The east door of the hall stands wide open. The lamps flicker."
    woven += " A door creaks somewhere above you."
    assert check_rewrite(played, woven, "The east door of the hall stands wide open.", fact) == ""
    # Its planted words missing from its text, or already in the narration: nothing planted.
    assert "not in its text" in check_rewrite(played, played, "The east door is open.", fact)
    assert "in the narration already" in check_rewrite(played, woven, "The lamps flicker.", fact)
    # The rest rewritten: not the turn as played with one contradiction.
    retold = "Darkness swallows you whole as you creep in. The east door of the hall stands wide open."
    why = check_rewrite(played, retold, "The east door of the hall stands wide open.", fact)
    assert why.startswith("the rest of its text is not the narration as played (similarity")
    # Planted words that do not say what they contradict.
    vague = played + " Something feels wrong."
    assert "carry 0% of what they contradict" in check_rewrite(played, vague, "Something feels wrong.", fact)


def _rewrites(run: Run, items: dict) -> Callable[[Request], str | None]:
    """A planting model that rewrites fact plants well (the fact denied, woven in after the first sentence),
    commitment plants badly (the whole passage retold), and answers player-input plants with no JSON."""
    by_key = {(e, i.turn, rewrite_key(i)): i for e, its in items.items() for i in its}

    def rule(request: Request) -> str | None:
        tags = request.tags
        if tags.get("stage") != "plant_rewrite":
            return None
        item = by_key[(tags["episode"], tags["turn"], tags["key"])]
        played = item.original
        if item.kind == "fact":
            planted = f"Whatever you were told, {item.sentence[len('It is not true that ') :]}"
            planted = planted.replace(".", " is simply false.", 1) if planted.endswith(".") else planted
            first, _, rest = played.partition(". ")
            text = f"{first}. {planted} {rest}" if rest else f"{played} {planted}"
            return json.dumps({"text": text, "planted": planted})
        if item.kind == "commitment":
            return json.dumps({"text": f"Everything changes. {item.sentence}", "planted": item.sentence})
        return "not JSON"

    return rule


def test_model_planted_items_are_judged_as_rewritten_and_failed_rewrites_fall_back(source: Run, tmp_path: Path) -> None:
    items = _items(source)
    engine = ScriptedEngine(
        rules=_rewrites(source, items),
        policy=RandomPolicy(),
        plant=PlantJudge(dict.fromkeys(CONFLICT_TYPES, 1.0), dict.fromkeys(CONFLICT_TYPES, 0.0)),
    )
    store = RunDir(tmp_path / "m")
    store.open({"kind": "test"}, identity="m")
    binding = RoleBinding(engine, Sampling(), "scripted")
    pack = PromptPack.load(None, (*TEMPLATES, "plant_rewrite"))
    calls = CallService(roles={"auditor": binding, "narrator": binding}, pack=pack, store=store, seed=5)
    try:
        out = asyncio.run(judge_all(source, items, calls, concurrency=16, rewrite=True))
    finally:
        store.close()
    judged = [a for r in out.values() for a in r.items]
    by_kind = {k: [a.item for a in judged if a.item.kind == k] for k in (CLEAN, *CONFLICT_TYPES)}
    told = {(e, t.turn): t.response for e, r in source.results.items() for t in r.turns}
    for it in by_kind["fact"]:  # rewritten, checked, judged as rewritten
        assert it.by == "model" and not it.refused and it.inserted.startswith("Whatever you were told")
        assert it.response[it.at :].startswith(it.inserted) and it.played == it.original
        assert it.response != it.played and "It is not true that" not in it.response  # not the fixed edit
    for it in by_kind["commitment"]:  # retold: refused, the fixed edit in its place
        assert it.by == "edit" and it.refused.startswith("the rest of its text is not the narration as played")
        assert it.response.endswith(it.sentence) and not it.played
    for it in by_kind["player_input"]:  # no valid answer in 3 attempts: the fixed edit
        assert it.by == "edit" and it.refused.startswith("no valid answer")
    assert all(i.by == "edit" and not i.refused for i in by_kind[CLEAN])
    for e, r in out.items():
        for a in r.items:
            assert a.item.original == told[(e, a.item.turn)]
    rewrites = [r for r in engine.requests if r.tags["stage"] == "plant_rewrite"]
    assert len(rewrites) == sum(len(v) for k, v in by_kind.items() if k != CLEAN) + 2 * len(by_kind["player_input"])
    assert all(r.json_schema is not None for r in rewrites)  # grammar-constrained, as every stage
    fig = measure("m", "", "", list(out.values()), 200, 0, 0.95)
    n_fact, n_rest = len(by_kind["fact"]), len(by_kind["commitment"]) + len(by_kind["player_input"])
    assert (fig.rewritten, fig.refused) == (n_fact, n_rest)
    assert any(
        n.startswith(f"planting model: {n_fact} of {n_fact + n_rest} planted items rewritten by it") for n in fig.notes
    )
    by = {s.figure.key: s for s in fig.shares}
    assert by["id_right:fact"].value == 1.0  # the scripted auditor still finds the planted fact, by its id
    html = marked(next(a for a in judged if a.item.by == "model"))
    assert "<mark class=planted>Whatever you were told" in html


def test_cli_a_planting_model_is_part_of_the_items_identity(tmp_path: Path, source: Run) -> None:
    base = ("mode=plant", f"runs=[{source.path}]", *SCRIPTED)
    plain = run_cli(*base, f"out_dir={tmp_path / 'e'}", cwd=tmp_path)
    model = run_cli(*base, "plant.model=narrator", f"out_dir={tmp_path / 'n'}", cwd=tmp_path)
    assert plain.returncode == 0 and model.returncode == 0, model.stderr
    pe, pn = load_plant_dir(tmp_path / "e"), load_plant_dir(tmp_path / "n")
    assert pe.plants != pn.plants and pe.manifest["identity"] != pn.manifest["identity"]
    assert set(pn.manifest["models"]) == {"auditor", "narrator"} and set(pe.manifest["models"]) == {"auditor"}
    # The scripted planting model has no skill: every rewrite is refused, and the items are the fixed edits.
    planted = sum(a.item.planted for r in pn.results for a in r.items)
    assert f"planting model: 0 of {planted} planted items rewritten by it; {planted} rewrite(s) refused" in model.stdout
    assert [a.item.response for r in pn.results for a in r.items] == [
        a.item.response for r in pe.results for a in r.items
    ]
    # Another auditor on the same planting model: the same items' digest (paired), the same rewrites asked.
    other = run_cli(*base, "plant.model=narrator", "engine.plant_recall=0.3", f"out_dir={tmp_path / 'o'}", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    po = load_plant_dir(tmp_path / "o")
    assert po.plants == pn.plants and po.manifest["identity"] != pn.manifest["identity"]
    assert [a.item for r in po.results for a in r.items] == [a.item for r in pn.results for a in r.items]
    log = [json.loads(line) for line in (tmp_path / "n" / "calls.jsonl").read_text().splitlines()]
    assert {line["stage"] for line in log if line["role"] == "narrator"} == {"plant_rewrite"}


def test_the_miss_correction_inverts_recall_and_false_alarms() -> None:
    assert float(correct(0.05, 0.5, 0.01)) == pytest.approx(0.04 / 0.49)
    assert float(correct(0.001, 0.5, 0.01)) == 0.0  # fewer flags than false alarms alone: none real
    assert np.isnan(correct(0.05, 0.3, 0.3))  # an auditor that tells nothing apart corrects nothing
    # 40 stories of 50 turns: 1 of 50 turns flagged, by an auditor of recall 0.5 and no false alarm: 2 of 50 real.
    stories = [f"s{i}" for i in range(40)]
    turns = np.full(40, 50.0)
    ended = {"fact": np.ones(40, dtype=bool)}
    exact = Measured(0.5, 1e6), Measured(0.0, 1e6)
    [rate] = corrected_rates(stories, turns, ended, {"fact": exact}, 400, 0, 0.95)
    assert rate.flagged == pytest.approx(0.02) and rate.value == pytest.approx(0.04)
    assert rate.lo <= 0.04 <= rate.hi
    # A recall measured on few items: the same point, a wider interval.
    [loose] = corrected_rates(stories, turns, ended, {"fact": (Measured(0.5, 10), exact[1])}, 400, 0, 0.95)
    assert loose.value == rate.value and loose.hi - loose.lo > 2 * (rate.hi - rate.lo)


def test_a_report_over_a_run_and_a_plant_of_its_auditor_corrects_for_misses(tmp_path: Path, source: Run) -> None:
    planted = run_cli(
        "mode=plant",
        f"runs=[{source.path}]",
        *SCRIPTED,
        "engine.plant_recall=0.5",
        f"out_dir={tmp_path / 'p'}",
        cwd=tmp_path,
    )
    assert planted.returncode == 0, planted.stderr
    rep = run_cli(
        "mode=report",
        f"runs=[{source.path},{tmp_path / 'p'}]",
        f"report.out={tmp_path / 'rep'}",
        "report.resamples=300",
        "report.html=false",
        cwd=tmp_path,
    )
    assert rep.returncode == 0, rep.stderr
    doc = (tmp_path / "rep" / "results.md").read_text()
    assert "## The auditor's misses" in doc
    # The terminal gives the answer first; the details line names where the misses are.
    [details] = [line for line in rep.stdout.splitlines() if line.startswith("details (")]
    assert "the auditor's misses" in details and details.endswith("results.md")
    section = doc.split("## The auditor's misses")[1].split("\n## ")[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert {r[1] for r in rows} == set(CONFLICT_TYPES)
    for r in rows:  # flagged, recall, false alarm, corrected, [lo, hi] (per 100 turns, %)
        flagged, recall, alarm = float(r[2]), float(r[3]) / 100, float(r[4]) / 100
        if r[5] != "n/a" and recall > alarm:
            assert float(r[5]) == pytest.approx(max(0.0, (flagged - 100 * alarm) / (recall - alarm)), abs=0.011)
            lo, hi = (float(x) for x in r[6].strip(" |[]").split(", "))
            assert lo <= float(r[5]) <= hi
    # A plant directory of another auditor corrects nothing, and says so.
    other = load_plant_dir(tmp_path / "p")
    config = {**other.manifest["config"], "auditor": {"model": {"name": "another-model"}}}
    stranger = replace(other, manifest={**other.manifest, "config": config})
    md, notes = misses_section([source], [stranger], 200, 0, 0.95)
    assert md == "" and notes == [
        f"{stranger.path}: its auditor (another-model on scripted) audited none of these runs"
    ]
