"""What ran, as the report reads it from a run's manifest (report/ran.py): each role's engine and model,
never the current config; the scripted lines only where a scripted engine answered."""

from __future__ import annotations

from typing import Any

from ncp_local.report.ran import NOT_RECORDED, SCRIPTED_LINE, ran_notes, what_ran


def _manifest(models: dict[str, dict[str, Any]], **config: Any) -> dict[str, Any]:
    return {"models": models, "config": {"engine": {"name": "vllm"}, **config}}


EMBEDDED = {"name": "smollm2-135m-instruct", "path": "embedded", "engine": "vllm"}
SERVED = {"name": "qwen3-8b", "path": "/models/Qwen/Qwen3-8B", "engine": "openai", "endpoint": {"served_model": "q8"}}
SCRIPTED = {"name": "scripted", "path": "embedded", "engine": "scripted"}


def test_each_role_is_named_by_engine_and_model() -> None:
    one = what_ran(_manifest({"narrator": EMBEDDED, "player": EMBEDDED, "auditor": EMBEDDED}))
    assert (one.engine, one.models, one.short) == (
        "vllm",
        "smollm2-135m-instruct (embedded)",
        "vllm: smollm2-135m-instruct (embedded)",
    )
    mixed = what_ran(_manifest({"narrator": EMBEDDED, "player": SCRIPTED, "auditor": SERVED}))
    assert mixed.engine == "narrator=vllm player=scripted auditor=openai" and not mixed.scripted
    assert mixed.model("auditor") == "q8 (served)" and mixed.model("player") == "scripted"
    # A manifest without a models section falls back to its own recorded config, never today's.
    old = what_ran({"config": {"engine": {"name": "vllm"}, "narrator": {"model": {"name": "m", "path": "/w/m"}}}})
    assert old.model("narrator") == "m (/w/m)" and old.model("auditor") == NOT_RECORDED
    assert what_ran({}).short == NOT_RECORDED  # an official folder records no engine


def test_scripted_lines_only_for_scripted_runs() -> None:
    scripted = _manifest({r: SCRIPTED for r in ("narrator", "player", "auditor")}, condition={"name": "natural"})
    model = _manifest({r: EMBEDDED for r in ("narrator", "player", "auditor")})
    assert SCRIPTED_LINE not in ran_notes([("m", model)])
    lines = ran_notes([("s", scripted)])
    assert lines[0] == "s: engine scripted, no model (every role)" and SCRIPTED_LINE in lines
    # Two scripted runs that differ in the condition and the seed: the condition is named as unread.
    other = {**scripted, "config": {**scripted["config"], "condition": {"name": "adversarial"}, "seed": 1}}
    pair = ran_notes([("a", scripted), ("b", other)])
    assert any("`condition.name`" in line and "does not read" in line and "seed" not in line for line in pair)
