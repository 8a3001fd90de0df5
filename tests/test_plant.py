"""mode=plant: contradictions of known truth planted into a finished run, judged, measured with intervals."""

from __future__ import annotations

import asyncio
import csv
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from cli_runner import CliResult, run_cli
from helpers import spec_doc
from ncp_local import analysis
from ncp_local.engines.scripted import PlantJudge, RandomPolicy, ScriptedEngine
from ncp_local.execution.calls import CallService, RoleBinding, Sampling
from ncp_local.exits import EXIT_ENGINE_DEAD
from ncp_local.modes.plant import judge_all
from ncp_local.protocol import ledger
from ncp_local.protocol.plant import CLEAN, clean_turns, draw_items, items_digest
from ncp_local.protocol.prompts import PromptPack
from ncp_local.protocol.replay import replay
from ncp_local.protocol.stages import CONFLICT_TYPES
from ncp_local.report.plant_dirs import load_plant_dir
from ncp_local.report.plants import compare_auditors, measure, share_band
from ncp_local.report.plants_doc import marked
from ncp_local.report.runs import Run, attach_specs, load_run
from ncp_local.rundir.store import RunDir

SCRIPTED = ("engine=scripted", "progress=false")


def planted_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The rig's three specs, 6 turns, few conflicts: a run with clean turns to plant into."""
    root = tmp_path_factory.mktemp("plant")
    done = run_cli(*SCRIPTED, "max_turns=6", "engine.conflict_rate=0.05", f"out_dir={root / 'src'}", cwd=root)
    assert done.returncode == 0, done.stderr
    run = load_run(str(root / "src"))
    attach_specs(run, None, required=True)
    return run


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return planted_run(tmp_path_factory)


def _items(run: Run, turns: int = 3, seed: int = 0, place: str = "end") -> dict[str, list]:
    return {
        name: draw_items(run.specs[r.spec_id], r, CONFLICT_TYPES, turns, place, seed) for name, r in run.results.items()
    }


def test_plants_are_drawn_from_the_ledger_into_clean_turns(source: Run) -> None:
    items = _items(source)
    assert items_digest([i for its in items.values() for i in its]) == items_digest(
        [i for its in _items(source).values() for i in its]
    )  # the same draw in every process
    assert _items(source, seed=1) != items
    for name, its in items.items():
        result = source.results[name]
        spec = source.specs[result.spec_id]
        views = {v.record.turn: v for v in replay(spec, result).turns}
        clean = {v.record.turn for v in clean_turns(spec, result)}
        for it in its:
            view = views[it.turn]
            assert it.turn in clean and view.committed and not view.record.conflicts
            assert it.original == view.record.response  # the plant taken out gives the turn as played
            if it.kind == CLEAN:
                assert it.response == view.record.response and not it.inserted
                continue
            assert it.response.endswith(it.sentence) and it.sentence not in view.record.response
            if it.kind == "fact":
                fact = {f.id: f for f in ledger.active_facts(view.projected)}[it.target]
                assert fact.text.rstrip(".").split(" ", 1)[1] in it.sentence  # the fact itself, denied
                assert it.sentence.startswith("It is not true that")
            elif it.kind == "commitment":
                assert view.before.status_map[it.target] == "pending"
                c = next(c for c in spec.commitments if c.id == it.target)
                assert c.violation_condition.rstrip(".").split(" ", 1)[1] in it.sentence
            else:
                assert it.target == "input" and view.record.player_input.strip()[:40] in it.sentence
        kinds = [i.kind for i in its]
        assert kinds.count(CLEAN) <= 3 and set(kinds) <= {CLEAN, *CONFLICT_TYPES}


def test_a_random_place_is_a_sentence_boundary(source: Run) -> None:
    for name, its in _items(source, place="random").items():
        told = {t.turn: t.response for t in source.results[name].turns}
        for it in its:
            assert it.original == told[it.turn]
            if it.planted:
                assert it.at == 0 or it.response[: it.at].rstrip()[-1] in ".!?"
                assert it.response[it.at :].lstrip().startswith(it.sentence)


def _judge(run: Run, items: dict, judge: PlantJudge, seed: int, root: Path) -> list:
    engine = ScriptedEngine(policy=RandomPolicy(), plant=judge)
    store = RunDir(root)
    store.open({"kind": "test"}, identity=f"t{seed}")
    calls = CallService(
        roles={"auditor": RoleBinding(engine, Sampling(), "scripted")}, pack=PromptPack.load(), store=store, seed=seed
    )
    try:
        out = asyncio.run(judge_all(run, items, calls, concurrency=32))
    finally:
        store.close()
    stages = {r.tags["stage"] for r in engine.requests}
    assert stages <= {"fact_update", "conflict_check", "double_check"}  # the turn's audit, nothing else
    return [out[e] for e in items]


def test_a_perfect_auditor_and_a_blind_one(source: Run, tmp_path: Path) -> None:
    items = _items(source)
    perfect = _judge(
        source,
        items,
        PlantJudge(dict.fromkeys(CONFLICT_TYPES, 1.0), dict.fromkeys(CONFLICT_TYPES, 0.0)),
        1,
        tmp_path / "a",
    )
    for r in perfect:
        for a in r.items:
            assert a.flagged == a.item.planted
            if a.item.planted:
                assert a.types == {a.item.kind} and a.aimed  # the planted id cited
                assert a.audit.double_check is not None and a.audit.double_check.confirmed
    figs = measure("perfect", "", "", perfect, 200, 0, 0.95)
    by = {s.figure.key: s for s in figs.shares}
    assert by["recall:fact"].value == 1.0 and by["false_alarm"].value == 0.0
    assert by["recall:fact"].lo < 1.0 and by["false_alarm"].hi > 0.0  # n of n still has a band
    blind = _judge(
        source,
        items,
        PlantJudge(dict.fromkeys(CONFLICT_TYPES, 0.0), dict.fromkeys(CONFLICT_TYPES, 0.0)),
        2,
        tmp_path / "b",
    )
    assert not any(a.flagged for r in blind for a in r.items)


def test_a_conflict_of_the_right_type_citing_another_id_is_not_the_plant_found(source: Run, tmp_path: Path) -> None:
    items = _items(source)
    wrong = _judge(
        source,
        items,
        PlantJudge(
            dict.fromkeys(CONFLICT_TYPES, 1.0), dict.fromkeys(CONFLICT_TYPES, 0.0), dict.fromkeys(CONFLICT_TYPES, 1.0)
        ),
        1,
        tmp_path / "w",
    )
    planted = [a for r in wrong for a in r.items if a.item.planted]
    assert {a.item.kind for a in planted} == set(CONFLICT_TYPES)
    for a in planted:
        assert a.flagged and a.typed
        cited = {c.id for c in a.audit.conflicts}
        if a.item.kind == "player_input":  # `input` is the one id a player-input conflict can cite
            assert a.aimed and cited == {"input"}
        else:
            assert not a.aimed and a.item.target not in cited and cited  # found, typed, but aimed elsewhere
    by = {s.figure.key: s for s in measure("wrong id", "", "", wrong, 200, 0, 0.95).shares}
    for t in ("fact", "commitment"):
        assert by[f"recall:{t}"].value == by[f"type_right:{t}"].value == 1.0 and by[f"id_right:{t}"].value == 0.0
    assert by["id_right:player_input"].value == 1.0
    assert by["id_right:fact"].figure.label == "id named right, fact"
    assert by["type_right:fact"].figure.label == "type named right, fact"
    # Half the found plants aimed elsewhere: the id named right falls to about half the type named right.
    half = _judge(
        source,
        _items(source, turns=6),
        PlantJudge(dict.fromkeys(CONFLICT_TYPES, 1.0), dict.fromkeys(CONFLICT_TYPES, 0.0), {"fact": 0.5}),
        2,
        tmp_path / "h",
    )
    by = {s.figure.key: s for s in measure("half", "", "", half, 200, 0, 0.95).shares}
    assert by["type_right:fact"].value == 1.0 and 0.2 < by["id_right:fact"].value < 0.8
    assert by["id_right:commitment"].value == 1.0
    assert by["id_right:fact"].lo < by["id_right:fact"].value < by["id_right:fact"].hi


def test_clustered_band_is_wider_when_a_story_decides_all_its_items() -> None:
    # 20 stories of 10 items each: all found or all missed per story (one story, one verdict) against the
    # same share with items independent: the clustered band must be far wider.
    rng = random.Random(0)
    stories = [f"s{g}" for g in range(20) for _ in range(10)]
    whole = np.repeat([float(rng.random() < 0.7) for _ in range(20)], 10)
    mixed = np.asarray([float(rng.random() < whole.mean()) for _ in range(200)])
    counted = np.ones(200)
    p1, lo1, hi1 = share_band(whole, counted, stories, 500, 0, 0.95)
    p2, lo2, hi2 = share_band(mixed, counted, stories, 500, 0, 0.95)
    assert lo1 <= p1 <= hi1 and lo2 <= p2 <= hi2
    assert (hi1 - lo1) > 2 * (hi2 - lo2)


def test_two_scripted_auditors_of_different_recall_differ_paired(source: Run, tmp_path: Path) -> None:
    items = _items(source, turns=6)
    fa = dict.fromkeys(CONFLICT_TYPES, 0.0)
    good = _judge(
        source, items, PlantJudge({"fact": 1.0, "commitment": 0.9, "player_input": 0.9}, fa), 3, tmp_path / "g"
    )
    poor = _judge(
        source, items, PlantJudge({"fact": 0.1, "commitment": 0.9, "player_input": 0.9}, fa), 4, tmp_path / "p"
    )
    cmp = compare_auditors([("good", good), ("poor", poor)], 500, 0, 0.95)[0]
    fact = next(d for d in cmp.rows if d.figure.key == "recall:fact")
    assert fact.diff < -0.6 and fact.hi < 0 and fact.p <= 0.25  # 3 stories: the sign-flip floor is 2/8
    same = next(d for d in cmp.rows if d.figure.key == "false_alarm")
    assert same.diff == 0 and same.p == 1.0


def _write_dataset(root: Path, commitments: bool) -> Path:
    (root / "specs").mkdir(parents=True)
    ids = ["a1", "a2"]
    for sid in ids:
        doc = spec_doc(sid, n_facts=3, n_nodes=3, types=("ordering", "achievement") if commitments else ())
        (root / "specs" / f"{sid}.yaml").write_text(yaml.safe_dump(doc))
    (root / "index.yaml").write_text(yaml.safe_dump({"specs": ids}))
    return root


def test_cli_plant_sweep_resume_html_and_report(tmp_path: Path, source: Run) -> None:
    src = source.path
    a = run_cli(
        "mode=plant", f"runs=[{src}]", *SCRIPTED, "engine.plant_recall=0.95", f"out_dir={tmp_path / 'a'}", cwd=tmp_path
    )
    assert a.returncode == 0, a.stderr
    assert "a scripted auditor" in a.stdout and "| recall, fact |" in a.stdout
    b = run_cli(
        "mode=plant",
        f"runs=[{src}]",
        *SCRIPTED,
        "engine.plant_recall.fact=0.2",
        "engine.plant_wrong_id.commitment=1",
        f"out_dir={tmp_path / 'b'}",
        cwd=tmp_path,
    )
    assert b.returncode == 0, b.stderr
    pa, pb = load_plant_dir(tmp_path / "a"), load_plant_dir(tmp_path / "b")
    assert pa.plants == pb.plants and pa.label != pb.label  # the same items, two auditors
    assert "wrong id fact 0 commitment 1 player_input 0" in pb.label and "wrong id" not in pa.label
    rows = {r["figure"]: r for r in csv.DictReader((tmp_path / "b" / "plants.csv").open())}
    assert float(rows["type_right:commitment"]["value"]) > 0.5 and float(rows["id_right:commitment"]["value"]) == 0.0
    assert pa.manifest["identity"] != pb.manifest["identity"]
    html = (tmp_path / "a" / "plants.html").read_text()
    assert "<mark class=planted>It is not true that" in html and "<td class=original>" in html
    again = run_cli(
        "mode=plant", f"runs=[{src}]", *SCRIPTED, "engine.plant_recall=0.95", f"out_dir={tmp_path / 'a'}", cwd=tmp_path
    )
    assert again.returncode == 0 and "nothing left to do" in again.stdout
    # A result edited by hand fails its seal: moved aside and judged again.
    first = sorted((tmp_path / "a" / "results").glob("*.json"))[0]
    first.write_text(first.read_text().replace('"turn": ', '"turn":  ', 1)[:-5])
    healed = run_cli(
        "mode=plant", f"runs=[{src}]", *SCRIPTED, "engine.plant_recall=0.95", f"out_dir={tmp_path / 'a'}", cwd=tmp_path
    )
    assert healed.returncode == 0 and "quarantine" in healed.stderr
    assert load_plant_dir(tmp_path / "a").results == pa.results  # judged again to the same verdicts
    rep = run_cli(
        "mode=report",
        f"runs=[{tmp_path / 'a'},{tmp_path / 'b'}]",
        f"report.out={tmp_path / 'rep'}",
        "report.resamples=300",
        cwd=tmp_path,
    )
    assert rep.returncode == 0, rep.stderr
    assert "## Paired differences" in rep.stdout
    paired = list(csv.DictReader((tmp_path / "rep" / "plants_paired.csv").open()))
    fact = next(row for row in paired if row["figure"] == "recall:fact")
    assert float(fact["difference"]) < -0.5 and float(fact["lo"]) < float(fact["difference"]) < float(fact["hi"])
    # Three stories: every sign-flip pattern is enumerated, and no p-value can fall below 2/8.
    assert float(fact["p"]) == 0.25
    assert (tmp_path / "rep" / "plants.html").is_file()
    # The analysis table `plants`: plants.csv's figures, from the directories and from the Parquet export.
    frame = analysis.plants([str(tmp_path / "a"), str(tmp_path / "b")])
    csv_rows = list(csv.DictReader((tmp_path / "b" / "plants.csv").open()))
    b_rows = frame[frame.plant_dir == str(tmp_path / "b")].set_index("figure")
    assert len(b_rows) == len(csv_rows) and len(frame) == 2 * len(csv_rows)
    for row in csv_rows:
        got = b_rows.loc[row["figure"]]
        assert (got["hits"], got["items"]) == (int(row["hits"]), int(row["items"]))
        assert got.value_lo <= got.value <= got.value_hi
    assert b_rows.loc["id_right:commitment"].value == 0.0 and b_rows.loc["type_right:commitment"].value > 0.5
    assert b_rows.loc["id_right:commitment"].measure == "id_right"
    assert b_rows.loc["id_right:commitment"].conflict_type == "commitment"
    assert b_rows.loc["false_alarm"].conflict_type is None and b_rows.loc["false_alarm"].measure == "false_alarm"
    assert set(frame.plants) == {pa.plants} and set(frame.label) == {pa.label, pb.label}
    exp = run_cli(
        "mode=export",
        f"runs=[{src},{tmp_path / 'b'}]",
        "export.format=parquet",
        f"export.out={tmp_path / 'tables'}",
        cwd=tmp_path,
    )
    assert exp.returncode == 0, exp.stderr
    assert "plants: " + str(len(csv_rows)) + " rows" in exp.stdout
    both = analysis.tables(tmp_path / "tables", ["runs", "plants"])
    assert len(both["runs"]) == 1  # the run's row beside the auditor's figures
    pd.testing.assert_frame_equal(
        both["plants"], analysis.plants(str(tmp_path / "b")), check_exact=True, check_dtype=True
    )
    (tmp_path / "tables" / "plants.parquet").unlink()  # as an export made before the table existed
    old = analysis.tables(tmp_path / "tables")
    assert old["plants"].empty and list(old["plants"].columns) == list(both["plants"].columns)
    refused = run_cli("mode=export", f"runs=[{tmp_path / 'b'}]", "export.format=inspect", cwd=tmp_path)
    assert refused.returncode == 2 and "exports only as export.format=parquet" in refused.stderr


def test_bad_inputs_are_one_line_and_exit_2(tmp_path: Path, source: Run) -> None:
    # A run whose every episode ended at its first turn in a conflict: no clean turn to plant into.
    dead = run_cli(
        *SCRIPTED,
        "max_turns=2",
        "engine.conflict_rate=1.0",
        "engine.overturn_rate=0.0",
        f"out_dir={tmp_path / 'dead'}",
        cwd=tmp_path,
    )
    assert dead.returncode == 0, dead.stderr
    none = run_cli("mode=plant", f"runs=[{tmp_path / 'dead'}]", *SCRIPTED, cwd=tmp_path)
    assert none.returncode == 2 and "no finished turn that committed clean" in none.stderr
    assert len(none.stderr.strip().splitlines()) == 1
    # A run whose stories have no commitment: no commitment can be broken.
    data = _write_dataset(tmp_path / "data", commitments=False)
    bare = run_cli(
        *SCRIPTED,
        f"dataset.path={data}",
        "max_turns=3",
        "engine.conflict_rate=0.0",
        f"out_dir={tmp_path / 'bare'}",
        cwd=tmp_path,
    )
    assert bare.returncode == 0, bare.stderr
    never = run_cli("mode=plant", f"runs=[{tmp_path / 'bare'}]", *SCRIPTED, cwd=tmp_path)
    assert never.returncode == 2 and "plant.types" in never.stderr and "pending commitment" in never.stderr
    ok = run_cli(
        "mode=plant", f"runs=[{tmp_path / 'bare'}]", *SCRIPTED, "plant.types=[fact,player_input]", cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    typo = run_cli("mode=plant", f"runs=[{source.path}]", *SCRIPTED, "plant.types=[fakt]", cwd=tmp_path)
    assert typo.returncode == 2 and "'fakt' is not a conflict type" in typo.stderr
    # An auditor that cannot load: refused by the pre-flight, before any model loads.
    missing = run_cli(
        "mode=plant", f"runs=[{source.path}]", "auditor.model.path=/nonexistent/model", "progress=false", cwd=tmp_path
    )
    assert missing.returncode == 2 and "auditor.model.path" in missing.stderr, missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    assert not list(source.path.parent.glob("plant-*"))  # nothing written for a refused input


def test_marked_html_shows_exactly_the_planted_words(source: Run) -> None:
    from ncp_local.protocol.plant import ItemAudit
    from ncp_local.protocol.reaudit import TurnAudit

    its = next(iter(_items(source, place="random").values()))
    planted = next(i for i in its if i.planted)
    html = marked(ItemAudit(item=planted, audit=TurnAudit(turn=planted.turn)))
    inside = html.split("<mark class=planted>")[1].split("</mark>")[0]
    assert inside.replace("&quot;", '"').replace("&#x27;", "'") == planted.sentence
    assert json.loads(planted.model_dump_json())["inserted"].strip() == planted.sentence


def test_none_found_still_reaches_a_rate_the_items_cannot_rule_out() -> None:
    # 0 of 55: Jeffreys' upper limit (4.4%) would exclude a true 5%; the exact one-sided limit is 6.5%.
    stories = [f"s{i % 29}" for i in range(55)]
    p, lo, hi = share_band(np.zeros(55), np.ones(55), stories, 300, 0, 0.95)
    assert (p, lo) == (0.0, 0.0) and hi == pytest.approx(1 - 0.025 ** (1 / 55))
    p, lo, hi = share_band(np.ones(55), np.ones(55), stories, 300, 0, 0.95)
    assert (p, hi) == (1.0, 1.0) and lo == pytest.approx(0.025 ** (1 / 55))


@pytest.mark.parametrize("mode", ["plant", "reaudit"])
def test_a_dead_engine_stops_either_judging_mode_the_same_way_and_it_resumes(
    mode: str, tmp_path: Path, source: Run
) -> None:
    # mode=plant and mode=reaudit share one harness (execution/rejudge.py): the same exit, the same resume.
    out = tmp_path / mode
    args = (f"mode={mode}", f"runs=[{source.path}]", *SCRIPTED, f"out_dir={out}")
    dead = run_cli(*args, "engine.die_after_calls=6", cwd=tmp_path)
    assert dead.returncode == EXIT_ENGINE_DEAD, dead.stderr
    assert "engine died" in dead.stderr and "the judged episodes are saved" in dead.stderr
    assert str(out) in dead.stderr and not (out / "DONE").exists()
    saved = len(list((out / "results").glob("*.json")))
    assert saved < len(source.results)
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (out / "DONE").exists() and len(list((out / "results").glob("*.json"))) == len(source.results)


def test_a_plant_directory_is_logged_to_the_tracker_with_its_figures(tmp_path: Path, source: Run) -> None:
    pytest.importorskip("mlflow", reason="mlflow-skinny is not installed (the `tracking` extra)")
    from mlflow.tracking import MlflowClient

    def plant_tracked(tracker: str, where: Path) -> CliResult:
        """The same plant into `tmp_path / "p"`, logged to `tracker` in `where` (a second one resumes it)."""
        return run_cli(
            "mode=plant",
            f"runs=[{source.path}]",
            *SCRIPTED,
            "engine.plant_wrong_id.fact=1",
            f"out_dir={tmp_path / 'p'}",
            f"tracker={tracker}",
            f"tracker.dir={where}",
            cwd=tmp_path,
        )

    store = tmp_path / "mlruns"
    done = plant_tracked("mlflow", store)
    assert done.returncode == 0, done.stderr
    assert "tracker=mlflow: run " in done.stdout and "warning" not in done.stderr
    run_id = json.loads((tmp_path / "p" / "tracker.json").read_text())["mlflow"]["id"]
    got = MlflowClient(tracking_uri=f"sqlite:///{store.resolve() / 'mlflow.db'}").get_run(run_id).data
    rows = list(csv.DictReader((tmp_path / "p" / "plants.csv").open()))
    assert rows
    for row in rows:
        name = row["figure"].replace(":", "_")
        assert got.metrics[f"{name}_items"] == int(row["items"])
        for suffix, col in (("", "value"), ("_lo", "lo"), ("_hi", "hi")):
            assert got.metrics[name + suffix] == pytest.approx(float(row[col]), abs=1e-6)
    assert got.metrics["id_right_fact"] == 0.0 and got.metrics["type_right_fact"] > 0
    assert got.tags["kind"] == "plant" and "wrong id fact 1" in got.tags["label"]
    # W&B, offline: the same figures in the run's summary (a plant directory has no S(t) nor cost table).
    pytest.importorskip("wandb", reason="wandb is not installed (the `tracking` extra)")
    import wandb_files
    from ncp_local.tracking.wandb_tracker import run_files

    wb = tmp_path / "wb"
    again = plant_tracked("wandb", wb)
    assert again.returncode == 0 and "warning" not in again.stderr, again.stderr
    wid = json.loads((tmp_path / "p" / "tracker.json").read_text())["wandb"]["id"]
    logged = wandb_files.summary(run_files(wb, wid))
    assert {k: logged[k] for k in got.metrics} == pytest.approx(got.metrics)
