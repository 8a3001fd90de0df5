"""The engine registry (engines/registry.py): one row per engine kind, and the rig reads its facts."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

from omegaconf import OmegaConf

from ncp_local.bindings import bind, ran_no_model, recorded_engine
from ncp_local.config import ENGINES, RunConfig, compose, validate
from ncp_local.engines.registry import KINDS, kind
from ncp_local.engines.scripted import ScriptedEngine

ROOT = Path(__file__).resolve().parent.parent


def default_config(overrides: list[str] = ()) -> RunConfig:  # type: ignore[assignment]
    return validate(OmegaConf.to_container(compose(["dataset.path=specs", *overrides]), resolve=True))


def test_every_kind_has_its_start_and_its_config_group() -> None:
    assert tuple(KINDS) == ENGINES
    assert {p.stem for p in (ROOT / "conf" / "engine").glob("*.yaml")} == set(KINDS)
    for row in KINDS.values():
        assert inspect.iscoroutinefunction(row.starter()), row.name
        # Exactly one way to run: in this process, behind an endpoint, or no model at all.
        assert [row.in_process, row.served, not row.runs_model].count(True) == 1, row
        assert (row.package is None) == (not row.install), row


def test_the_scripted_start_takes_the_run_settings_only_when_the_run_is_scripted() -> None:
    scripted = default_config(["engine=scripted", "engine.conflict_rate=0.9", "engine.delay_s=0.5"])
    own = asyncio.run(kind("scripted").starter()(scripted.narrator.model, scripted.engine, None))
    assert isinstance(own, ScriptedEngine) and own.policy.conflict_rate == 0.9 and own.delay_s == 0.5
    other = default_config()  # a scripted role in a vLLM run: the policy's defaults
    lent = asyncio.run(kind("scripted").starter()(other.narrator.model, other.engine, None))
    assert lent.policy.conflict_rate != 0.9 and lent.delay_s == 0


def test_roles_and_recorded_configs_read_the_facts_not_the_names() -> None:
    cfg = default_config(["auditor.engine=scripted"])
    bound = bind(cfg)
    assert bound["narrator"].kind.in_process and not bound["auditor"].kind.runs_model
    assert bound["auditor"].label == "scripted" and bound["narrator"].label == cfg.narrator.model.name
    raw = {"engine": {"name": "vllm"}, "auditor": {"engine": "scripted"}}
    assert recorded_engine(raw, "auditor") == "scripted" and recorded_engine(raw, "narrator") == "vllm"
    assert ran_no_model(raw, "auditor") and not ran_no_model(raw, "narrator") and not ran_no_model(raw)
    assert not ran_no_model({"engine": {"name": "an-engine-of-a-later-rig"}})  # unknown: never claimed scripted
