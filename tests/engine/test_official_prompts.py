"""The paper's own prompt files: every template, rendered on real state, leaves the embedded model's
window the room its stage's answer needs (no engine: the tokenizer vLLM loads for the model), and the
longest template of each role and every build template get a parsed answer from the real engine
(every template in `slow`).

The official templates are long (the double-check is about 22k characters), so they need the
embedded model's whole 8192-token window. Content quality is not asserted (a 135M model): that each
stage's rendered prompt fits, is accepted by the engine, and its answer passes the stage's contract.
What the engine adds over the token count is the same for every template of a role (the stage's
schema on the grammar backend, which test_rig_engine checks for every stage on the rig's own
prompts), so `make test` asks the engine for each role's longest prompt (and the build stages, whose
schemas no other engine test asks for) and `make test-all` for all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_helpers import ask_all, call_role, default_config, small_roles, stage_calls
from ncp_local.engines.chat_format import ChatFormat
from ncp_local.engines.settings import ModelSettings
from ncp_local.execution.calls import CallService, RoleBinding
from ncp_local.protocol.prompts import BUILD_TEMPLATES, OFFICIAL_FILES, PromptPack
from ncp_local.protocol.spec import load_dataset
from ncp_local.protocol.stages import min_room
from ncp_local.rundir.call_log import read_calls
from ncp_local.rundir.store import RunDir

ROOT = Path(__file__).resolve().parents[2]
# conf/*/smollm2.yaml's sampling with the engine tests' small bounds: the subject is the templates, and
# the 135M model fills every string to its bound (engine_helpers.SMALL_BOUNDS).
ROLES = small_roles()
WINDOW = default_config().auditor.model.max_model_len  # conf/model/smollm2.yaml's, as the engine runs it


def _calls(official_prompts: Path) -> tuple[PromptPack, Any, list]:
    pack = PromptPack.load(official_prompts, required=("narrate", "hiagent_narrate", *OFFICIAL_FILES.values()))
    spec = load_dataset(ROOT / "specs").specs[0]
    return pack, spec, stage_calls(spec)


def _sizes(embedded_model_path: Path, pack: PromptPack, calls: list) -> dict[str, tuple[str, int, int]]:
    """{template: (role, prompt tokens, least answer room)} as the engine and the call service count them."""
    chat = ChatFormat.load(embedded_model_path, ModelSettings(name="smollm2", path=str(embedded_model_path)))
    return {
        template: (call_role(stage), chat.count(pack.render(template, variables, extra=extra)), min_room(stage, ids))
        for stage, template, variables, ids, extra in calls
    }


def test_every_official_template_leaves_its_answer_room(embedded_model_path: Path, official_prompts: Path) -> None:
    pack, _, calls = _calls(official_prompts)
    sizes = _sizes(embedded_model_path, pack, calls)
    assert set(sizes) == {template for _, template, *_ in calls} and len(sizes) == len(calls)
    for template, (_, tokens, room) in sizes.items():
        # What the backend checks before sending (else ContextOverflow, and the episode is censored).
        assert 500 < tokens and tokens + room <= WINDOW, (template, tokens, room)
    # The reason the engine needs its whole window: the longest official prompt is over half of it.
    assert max(tokens for _, tokens, _ in sizes.values()) > WINDOW // 2, sizes


@pytest.mark.parametrize("which", ["longest", pytest.param("all", marks=pytest.mark.slow)])
def test_official_templates_get_a_parsed_answer(
    which: str, engine: Any, embedded_model_path: Path, official_prompts: Path, tmp_path: Path
) -> None:
    pack, spec, calls = _calls(official_prompts)
    if which == "longest":
        sizes = _sizes(embedded_model_path, pack, calls)
        longest = {
            role: max((t for t, (r, *_) in sizes.items() if r == role), key=lambda t: sizes[t][1]) for role in ROLES
        }
        # And the build stages (short prompts, one schema each): the real-engine sibling of the `slow`
        # build from a synopsis (test_rig_engine).
        calls = [c for c in calls if c[1] in longest.values() or c[0].startswith("build_")]
        assert len(calls) == len(ROLES) + len(BUILD_TEMPLATES), longest
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
    ok = {c.key for c in logged if c.error is None}
    assert ok == {template for _, template, *_ in calls}
    # Every prompt was the official file's text with the state filled in.
    for c in logged:
        assert c.prompt_tokens > 500, c
