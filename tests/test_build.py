"""Spec building from synopses (PROTOCOL section 7) on the scripted backend."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import prompt, tag
from ncp_local.engines.base import Request
from ncp_local.engines.scripted import ScriptedEngine
from ncp_local.errors import InputError
from ncp_local.execution.calls import CallService, RoleBinding, Sampling
from ncp_local.modes.build import build_all, load_sources
from ncp_local.protocol.prompts import PromptPack
from ncp_local.protocol.spec import load_dataset
from ncp_local.rundir.store import RunDir

ROOT = Path(__file__).resolve().parent.parent


def _build(tmp_path: Path, rules: Any, sources: Path = ROOT / "specs" / "sources.yaml") -> tuple[dict, ScriptedEngine]:
    backend = ScriptedEngine(rules=rules)
    store = RunDir(tmp_path / "out" / ".build")
    store.open({}, "t")
    calls = CallService(
        roles={"auditor": RoleBinding(backend, Sampling(), "scripted")}, pack=PromptPack.load(), store=store
    )
    try:
        status = asyncio.run(build_all(calls, load_sources(sources)[:1], tmp_path / "out"))
    finally:
        store.close()
    return status, backend


def test_build_reasks_with_cross_check_errors_and_output_lints(tmp_path: Path) -> None:
    def rules(req: Request) -> Any:
        if tag(req)[0] == "build_commitments" and "REJECTED" not in prompt(req):
            return json.dumps(
                {
                    "commitments": [
                        {
                            "type": "achievement",
                            "description": "reach s_9",
                            "satisfaction_condition": "x",
                            "violation_condition": "y",
                        }
                    ]
                    * 2
                }
            )
        return None

    status, backend = _build(tmp_path, rules)
    assert status == {"red_riding_hood": "ok"}
    asks = [r for r in backend.requests if r.tags["stage"] == "build_commitments"]
    assert len(asks) == 2
    feedback = prompt(asks[1]).split("REJECTED")[1]
    assert "c_0 names beats that do not exist: s_9" in feedback
    # Each stage builds on the one before.
    facts_prompt = prompt(next(r for r in backend.requests if r.tags["stage"] == "build_facts"))
    assert "[s_3] beat 3" in facts_prompt and "[c_0] (achievement)" in facts_prompt
    ds = load_dataset(tmp_path / "out")
    assert [s.id for s in ds.specs] == ["red_riding_hood"] and ds.warnings == ()
    doc = yaml.safe_load((tmp_path / "out" / "specs" / "red_riding_hood.yaml").read_text())
    assert list(doc) == ["meta", "synopsis", "initial_facts", "commitments", "trajectory"]


def test_build_gives_up_after_rounds(tmp_path: Path) -> None:
    bad = json.dumps(
        {
            "commitments": [
                {
                    "type": "achievement",
                    "description": "s_7 first",
                    "satisfaction_condition": "x",
                    "violation_condition": "y",
                }
            ]
            * 2
        }
    )
    status, _ = _build(tmp_path, lambda r: bad if tag(r)[0] == "build_commitments" else None)
    assert status["red_riding_hood"].startswith("failed:") and "s_7" in status["red_riding_hood"]
    assert yaml.safe_load((tmp_path / "out" / "index.yaml").read_text()) == {"specs": []}


def test_bad_sources_file(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        yaml.safe_dump({"sources": [{"id": "a/b", "title": "t", "genres": ["x"], "player_role": "p", "synopsis": "s"}]})
    )
    with pytest.raises(InputError, match=r"sources\[0\]\.id"):
        load_sources(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"sources": [{"id": "a", "title": "t"}]}))
    with pytest.raises(InputError, match=r"sources\[0\]\.genres: missing"):
        load_sources(tmp_path / "s.yaml")


def test_commitment_schema_requires_an_achievement_first() -> None:
    import jsonschema

    from ncp_local.protocol.stages import schema_for

    schema = schema_for("build_commitments")
    entry = {"description": "d", "satisfaction_condition": "s", "violation_condition": "v"}
    jsonschema.validate({"commitments": [{"type": "achievement", **entry}, {"type": "ordering", **entry}]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"commitments": [{"type": "ordering", **entry}, {"type": "achievement", **entry}]}, schema)
