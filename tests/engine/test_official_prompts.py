"""The paper's own prompt files on the real engine: every template rendered on real state, one parsed answer each.

The official templates are long (the double-check is about 22k characters),
so this needs the embedded model's whole 8192-token window. Content quality
is not asserted (a 135M model): that each stage's rendered prompt is
accepted by the engine and its answer passes the stage's contract.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_helpers import ask_all, small_roles, stage_calls

from ncp_local.protocol.prompts import OFFICIAL_FILES, PromptPack
from ncp_local.execution.calls import CallService, RoleBinding
from ncp_local.protocol.spec import load_dataset
from ncp_local.execution.store import RunDir, read_calls

ROOT = Path(__file__).resolve().parents[2]
# conf/*/smollm2.yaml's sampling with the engine tests' small bounds: the subject is the templates, and
# the 135M model fills every string to its bound (engine_helpers.SMALL_BOUNDS).
ROLES = small_roles()


def test_every_official_template_gets_a_parsed_answer(engine: Any, official_prompts: Path, tmp_path: Path) -> None:
    pack = PromptPack.load(official_prompts, required=("narrate", "hiagent_narrate", *OFFICIAL_FILES.values()))
    spec = load_dataset(ROOT / "specs").specs[0]
    calls = stage_calls(spec)
    store = RunDir(tmp_path)
    store.open({"test": True}, "official-prompts")
    roles = {r: RoleBinding(engine.backend, s, "smollm2", b) for r, (s, b) in ROLES.items()}
    service = CallService(roles=roles, pack=pack, store=store, seed=0)

    try:
        answers = ask_all(engine, service, spec.id, calls)
    finally:
        store.close()
    assert len(answers) == len(calls) and all(a is not None for a in answers)
    logged = read_calls(tmp_path / "calls.jsonl")
    ok = {c["key"] for c in logged if c.get("error") is None}
    assert ok == {template for _, template, *_ in calls}
    # Every prompt was the official file's text with the state filled in.
    for c in logged:
        assert c["prompt_tokens"] > 500, c
