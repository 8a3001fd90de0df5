"""Narrator methods written for the official NCP-Bench code, run unchanged (`method.name=<module>:<Class>`).

The official baseline (imported from NCP_BENCH_REFERENCE, never copied) on the scripted engine over the
official dataset gives the same results as the rig's own `method=baseline` with the official prompt pack:
its calls carry the same stages and seeds, so the scripted answers are the same. A run killed in the middle
resumes from the rig's checkpoints to the same results; so does the official HiAgent. The method's
synchronous code runs on a thread of its own, so two episodes' calls are in flight together. A class of
neither kind is one line, exit 2."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from ncp_local.protocol import ledger
from ncp_local.protocol.narrators import narrator_factory
from ncp_local.protocol.official_method import OfficialMethod, is_official_narrator
from ncp_local.protocol.spec import load_spec
from ncp_local.rundir.turn_log import read_log

BASELINE = "ncpbench_reference_baseline:BaselineNarrator"


@pytest.fixture(scope="module")
def reference_on_path() -> Path:
    root = Path(os.environ.get("NCP_BENCH_REFERENCE") or "/nonexistent")
    paths = [
        root / "src",
        root / "reference-methods" / "baseline" / "src",
        root / "reference-methods" / "hiagent" / "src",
    ]
    if not all(p.is_dir() for p in paths):
        pytest.skip("official sources not available (set NCP_BENCH_REFERENCE to a reference clone)")
    for p in paths:
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    return root


def _play(out: Path, dataset: Path, reference: Path, *extra: str) -> Any:
    return run_cli(
        "engine=scripted",
        "dataset=ncp_bench",
        f"dataset.path={dataset}",
        f"prompts.dir={reference}",
        "max_turns=8",
        f"out_dir={out}",
        "progress=false",
        *extra,
    )


def _bodies(run: Path) -> dict[str, dict[str, Any]]:
    """Each result without its seal (the seal names the run's identity, which the method's name is part of)."""
    out = {}
    for f in sorted((run / "results").glob("*.json")):
        data = json.loads(f.read_text())
        data.pop("seal")
        out[f.stem] = data
    return out


@pytest.fixture(scope="module")
def official_run(reference_on_path: Path, official_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("official-baseline") / "run"
    res = _play(out, official_dataset, reference_on_path, f"method.name={BASELINE}")
    assert res.returncode == 0, res.stderr
    return out


def test_official_baseline_equals_the_rigs_baseline(
    official_run: Path, reference_on_path: Path, official_dataset: Path, tmp_path: Path
) -> None:
    rig = tmp_path / "rig"
    res = _play(rig, official_dataset, reference_on_path, "method=baseline")
    assert res.returncode == 0, res.stderr
    ours, theirs = _bodies(rig), _bodies(official_run)
    assert len(theirs) == 100 and ours == theirs
    # Not equal by being empty: the episodes played turns and ended every way.
    ends = {r["termination"] for r in theirs.values()}
    assert {"conflict", "max_turns", "all_resolved"} <= ends
    # The method's calls went through the rig: logged under the narrator role, with the stage's seed.
    calls = [json.loads(line) for line in (official_run / "calls.jsonl").read_text().splitlines()]
    narrate = [c for c in calls if c["stage"] == "narrate"]
    assert narrate and all(c["role"] == "narrator" for c in narrate)
    manifest = json.loads((official_run / "manifest.json").read_text())
    assert manifest["config"]["method"]["name"] == BASELINE


def test_a_killed_run_resumes_to_the_same_results(
    official_run: Path, reference_on_path: Path, official_dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    killed = _play(out, official_dataset, reference_on_path, f"method.name={BASELINE}", "engine.die_after_calls=1500")
    assert killed.returncode != 0 and "resume" in killed.stderr
    assert any((out / "checkpoints").glob("*.jsonl"))
    assert len(list((out / "results").glob("*.json"))) < 100
    resumed = _play(out, official_dataset, reference_on_path, f"method.name={BASELINE}")
    assert resumed.returncode == 0, resumed.stderr
    assert _bodies(out) == _bodies(official_run)


def test_the_methods_code_does_not_block_other_episodes(reference_on_path: Path, official_dataset: Path) -> None:
    """Two episodes' openings: each call waits until the other episode's call is in flight too. Were the
    method's synchronous code run on the event loop, the second would never start (a timeout here)."""
    cls = narrator_factory(BASELINE)
    assert issubclass(cls, OfficialMethod) and is_official_narrator(cls.METHOD)
    spec = load_spec(official_dataset / "specs" / "movie52.yaml")
    state = ledger.initial_state(spec)

    async def both() -> list[str]:
        entered = 0
        both_in = asyncio.Event()

        async def ask(stage: str, template: str, variables: dict[str, str], **kw: Any) -> str:
            nonlocal entered
            assert stage == "opening" and kw["role"] == "narrator" and kw["messages"][0].role == "user"
            entered += 1
            if entered == 2:
                both_in.set()
            await both_in.wait()
            return json.dumps({"text": f"Opening number {entered}."})

        narrators = [cls(), cls()]
        return await asyncio.wait_for(asyncio.gather(*(n.opening(spec, state, ask) for n in narrators)), 10)

    texts = asyncio.run(both())
    assert texts == ["Opening number 2.", "Opening number 2."]


def test_a_class_of_neither_kind_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run_cli("engine=scripted", "method.name=collections:OrderedDict", f"out_dir={out}", "progress=false")
    assert res.returncode == 2
    [line] = res.stderr.strip().splitlines()
    assert "method.name" in line and "collections:OrderedDict" in line and "official ncpbench Narrator" in line
    assert not out.exists()


def test_official_hiagent_runs_unchanged_and_resumes(
    official_run: Path, reference_on_path: Path, official_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HiAgent counts tokens with tiktoken's `o200k_base`, a file tiktoken downloads at first use (not here):
    that one encoding stands in as a byte-level one; the method's code is the official one."""
    tiktoken = pytest.importorskip("tiktoken")
    registry = pytest.importorskip("tiktoken.registry")

    standin = tiktoken.Encoding(
        name="o200k_base", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={}
    )
    monkeypatch.setitem(registry.ENCODINGS, "o200k_base", standin)
    out = tmp_path / "run"
    args = ("method=official_hiagent", "+method.config={max_input_tokens:4000}")
    killed = _play(out, official_dataset, reference_on_path, *args, "engine.die_after_calls=1500")
    assert killed.returncode != 0 and "resume" in killed.stderr
    # The method's memory went into the rig's checkpoints (its checkpoint_state), turn by turn.
    logs = [read_log(f, None).checkpoint for f in (out / "checkpoints").glob("*.jsonl")]
    states = [cp.narrator_state for cp in logs if cp is not None]
    assert (
        states
        and len(states) == len(logs)
        and all(s["core"]["memory"][0] == [["Observation", "Story initialized."]] for s in states)
    )
    assert any(len(s["core"]["memory"]) > 2 for s in states)
    resumed = _play(out, official_dataset, reference_on_path, *args)
    assert resumed.returncode == 0, resumed.stderr
    bodies = _bodies(out)
    assert len(bodies) == 100 and not any(b["termination"] == "invalid" for b in bodies.values())
    # On the scripted engine an answer depends on the call's stage and seed only, and HiAgent's turn calls
    # are the baseline's stage (`method_response_generate`, sent as plain text): the same stories.
    assert bodies == _bodies(official_run)


def test_each_episode_ends_with_the_methods_close_episode(reference_on_path: Path, tmp_path: Path) -> None:
    """The official runner's last call of an episode is `close_episode`; the rig makes it too, once per
    episode, so a method that holds resources per episode releases them."""
    from helpers import Scripted, make_spec
    from ncp_local.protocol.official_method import adapter_for
    from ncp_local.protocol.prompts import PromptPack

    base = narrator_factory(BASELINE).METHOD
    closed: list[int] = []

    class Counting(base):  # type: ignore[misc, valid-type]
        def close_episode(self) -> None:
            closed.append(id(self))
            super().close_episode()

    cls = adapter_for(Counting)
    specs = [make_spec(), make_spec("tiny2")]
    pack_dir = reference_on_path  # the official pack: the method's own prompt file is there
    run = Scripted(tmp_path, specs, max_turns=2, narrator=lambda pack, roles: cls(), pack_dir=pack_dir)
    results = run.run()
    assert set(results) == {"tiny", "tiny2"}
    assert len(closed) == 2 and len(set(closed)) == 2  # each episode's own method instance, once
    assert PromptPack.load(pack_dir).official
