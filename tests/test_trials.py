"""Trials (issue 37): k plays per story, named apart, seeded per role, resumed like episodes.

Played on the scripted engine, whose answers are drawn from each call's seed, so two trials
differ exactly where their seeds do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from ncp_local import config as config_mod
from ncp_local.execution import identity
from ncp_local.protocol.spec import ID_PATTERN
from ncp_local.protocol.trials import SEPARATOR, episode_name, parse_episode, seed_episode

STORIES = ("red_riding_hood", "treasure_island", "hound_of_the_baskervilles")  # specs/ (dataset=local)


def _run(out: Path, *extra: str) -> Any:
    done = run_cli("engine=scripted", "max_turns=6", f"out_dir={out}", "progress=false", *extra)
    assert done.returncode == 0, done.stderr
    return done


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "results").glob("*.json"))}


def _calls(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]


def test_episode_names_round_trip_and_never_read_as_a_spec() -> None:
    assert episode_name("movie09", 0) == "movie09"
    assert episode_name("movie09", 3) == f"movie09{SEPARATOR}3"
    for name in ("movie09", "a.b-c_d", "movie09~t1", "movie09~t12"):
        assert episode_name(*parse_episode(name)) == name
    # The separator is no spec id character, so no spec id is taken for another story's trial.
    assert not ID_PATTERN.fullmatch(f"movie09{SEPARATOR}1")
    # Trial 0 has no suffix (`x~t0` would be a second name for `x`), nor a trial a leading zero.
    for bad in ("movie09~t0", "movie09~t01", "movie09~tx", "~t1", "a b"):
        with pytest.raises(ValueError):
            parse_episode(bad)


def test_seed_episode_follows_vary() -> None:
    only_auditor = frozenset({"auditor"})
    assert seed_episode("s~t2", "auditor", only_auditor) == "s~t2"
    assert seed_episode("s~t2", "narrator", only_auditor) == "s"
    assert seed_episode("s", "auditor", only_auditor) == "s"  # trial 0 is trial 0 whatever varies


def _raw(*overrides: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    cfg = config_mod.compose(["engine=scripted", *overrides])
    raw = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(raw, dict)
    return raw


def test_identity_keeps_its_key_without_trials_and_with_any_count() -> None:
    base = _raw()
    before_trials = {k: v for k, v in base.items() if k != "trials"}  # a config of the rig before trials
    key = identity.settings(before_trials)
    assert identity.settings(base) == key
    assert identity.settings(_raw("trials.count=4")) == key  # a count is resumed, like `limit`
    assert identity.settings(_raw("trials.vary=[narrator,player,auditor]")) == key  # all roles, spelt out
    # Which roles vary changes what trials 1.. play: another experiment, another run directory.
    assert identity.settings(_raw("trials.vary=[auditor]")) != key
    assert identity.settings(_raw("trials.vary=[auditor]")) == identity.settings(_raw("trials.vary=[auditor]"))


def test_raising_trials_on_a_finished_run_plays_only_the_new_trials(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(out)
    one = _files(out)
    assert sorted(one) == sorted(f"{s}.json" for s in STORIES)
    calls_before = _calls(out)
    _run(out, "trials.count=2")
    two = _files(out)
    # Trial 0's files are untouched; each story gained its trial 1.
    assert {k: v for k, v in two.items() if k in one} == one
    assert sorted(set(two) - set(one)) == sorted(f"{s}~t1.json" for s in STORIES)
    new = _calls(out)[len(calls_before) :]
    assert new and all(c.get("trial") == 1 for c in new)
    assert "trial" not in json.dumps(calls_before)  # trial 0's log lines are a run without trials' lines
    for s in STORIES:
        t1 = json.loads(two[f"{s}~t1.json"])
        assert t1["trial"] == 1 and t1["seal"]["trial"] == 1 and t1["spec_id"] == s
    # Seed-dependent answers: the second plays are not copies of the first.
    assert any(json.loads(two[f"{s}~t1.json"])["turns"] != json.loads(one[f"{s}.json"])["turns"] for s in STORIES)
    again = _run(out, "trials.count=2")
    assert "already finished" in again.stdout


def test_vary_auditor_keeps_trial_zero_seeds_for_narrator_and_player(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(out, "trials.count=2", "trials.vary=[auditor]", "limit=1")
    calls = [c for c in _calls(out) if not c.get("speculative")]
    key = ("turn", "stage", "key", "attempt")
    seeds = {
        t: {tuple(c[k] for k in key): (c["role"], c["seed"]) for c in calls if c.get("trial", 0) == t} for t in (0, 1)
    }
    shared = set(seeds[0]) & set(seeds[1])
    roles = {seeds[0][k][0] for k in shared}
    assert {"narrator", "player", "auditor"} <= roles
    for k in shared:
        role, seed0 = seeds[0][k]
        same = seeds[1][k][1] == seed0
        assert same == (role != "auditor"), (k, role)


def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_results(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    _run(whole, "trials.count=3", "concurrency=2")
    expected = _files(whole)
    assert len(expected) == 9
    out = tmp_path / "killed"
    dead = run_cli(
        "engine=scripted",
        "max_turns=6",
        f"out_dir={out}",
        "progress=false",
        "trials.count=3",
        "concurrency=2",
        "engine.die_after_calls=60",
    )
    assert dead.returncode == 3, dead.stderr
    assert len(_files(out)) < 9 and list((out / "checkpoints").glob(f"*{SEPARATOR}*.json"))
    _run(out, "trials.count=3", "concurrency=2")
    assert _files(out) == expected
    assert not list((out / "checkpoints").glob("*.json"))


def test_shards_keep_a_storys_trials_and_merge_joins_every_trial(tmp_path: Path) -> None:
    out = tmp_path / "sharded"
    for i in (0, 1):
        _run(out, "trials.count=2", "shard.count=2", f"shard.index={i}")
    # Each story's trials are in the shard of the story (they share their prompts' prefixes).
    for shard in out.glob("shard-*"):
        names = {p.stem for p in (shard / "results").glob("*.json")}
        assert names == {n for s in {parse_episode(n)[0] for n in names} for n in (s, f"{s}~t1")}
    merged = run_cli("mode=merge", f"out_dir={out}", "progress=false")
    assert merged.returncode == 0, merged.stderr
    assert len(list((out / "merged" / "results").glob("*.json"))) == 6
    assert json.loads((out / "merged" / "manifest.json").read_text())["trials"] == 2
