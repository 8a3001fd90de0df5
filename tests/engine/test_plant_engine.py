"""mode=plant with the embedded model as the auditor: the items of one story's clean turn judged on the real
engine through the mode's own path, the figures written, and the figures saying they measure nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli_runner import run_cli
from engine_helpers import default_config, embedded_roles
from ncp_local.bindings import bind
from ncp_local.execution.calls import CallService, RoleBinding
from ncp_local.modes.plant import judge_all, what_it_measures
from ncp_local.protocol.plant import draw_items, plant_key
from ncp_local.protocol.prompts import PromptPack
from ncp_local.protocol.stages import CONFLICT_TYPES
from ncp_local.report.plants import measure
from ncp_local.report.plants_doc import write_plant_report
from ncp_local.report.runs import attach_specs, load_run
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.store import RunDir


def test_plant_runs_end_to_end_on_the_embedded_model_and_says_it_measures_nothing(engine: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    made = run_cli(
        "engine=scripted", "limit=1", "max_turns=1", "engine.conflict_rate=0", f"out_dir={src}", "progress=false"
    )
    assert made.returncode == 0, made.stderr
    run = load_run(str(src))
    attach_specs(run, None, required=True)
    items = {n: draw_items(run.specs[r.spec_id], r, CONFLICT_TYPES, 1, "end", 0) for n, r in run.results.items()}
    assert sum(map(len, items.values())) == 4  # one clean turn: as played, and one plant per type

    store = RunDir(tmp_path / "plant")
    store.open({"kind": "plant"}, "engine-plant")
    sampling, bounds = embedded_roles()["auditor"]
    calls = CallService(
        roles={"auditor": RoleBinding(engine.backend, sampling, "smollm2", bounds)}, pack=PromptPack.load(), store=store
    )
    try:
        done = engine.run(judge_all(run, items, calls, concurrency=8), timeout=900)
    finally:
        store.close()
    results = [done[n] for n in items]
    audits = [a for r in results for a in r.items]
    assert len(audits) == 4 and all(a.judged or a.audit.error for a in audits)
    logged = read_calls(tmp_path / "plant" / "calls.jsonl")
    assert {c.stage for c in logged} >= {"fact_update", "conflict_check"}
    # Each item's calls under its own key: `plant/clean`, and `plant/<type>/<the planted id>`.
    assert {c.key for c in logged} == {plant_key(i) for its in items.values() for i in its}
    assert {c.key.split("/")[1] for c in logged} == {"clean", *CONFLICT_TYPES}

    lines = what_it_measures(bind(default_config()))
    assert len(lines) == 1 and "measure nothing" in lines[0] and "auditor" in lines[0]
    figs = measure("smollm2", str(tmp_path / "plant"), "", results, 200, 0, 0.95)
    md, files = write_plant_report(tmp_path / "plant", [figs], [], results, 0.95, 200, lines)
    assert "measure nothing" in md and (tmp_path / "plant" / "plants.html").is_file()
    assert "measure nothing" in (tmp_path / "plant" / "plants.html").read_text()
