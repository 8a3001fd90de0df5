"""Roles on a served model, on the real thing: narrator, player and auditor on the session's `vllm serve`
of the embedded model (tests/engine/served.py), and a batched sweep whose auditor is on that server
while its narrators are not.

The served run's results are byte for byte those of the all-in-process run of the same config (seal
aside: it names the run identity, which differs by the roles' engine): the server runs the engine
arguments the rig's engine runs (engines/serve.py), renders the same chat template, takes the same
per-call seed and sampling, and compiles the same JSON schema with the same backend and whitespace
rule; fp32 on the CPU build is batch-invariant. The server gone mid-run ends the run like an engine
death (exit 3); back again, the same command resumes to the same results. The rig reaches the server
through a relay (tests/engine/served.py `Relay`) whose death is the server's death as the rig sees it
(connections reset, then refused), so the session's server starts once. The all-in-process run is the
baseline point of the session's reference sweep (tests/engine/conftest.py `reference_sweep`: batched
beside the HiAgent point, the speculative player off); this run is alone (`limit=1`: FITS only) with
the speculative player on, so its equality also shows that neither the sweep's batch neighbours nor
the speculative player change an episode. Every role is on the server so that neither of the run's
two processes starts an engine of its own (two engine starts fewer); one run with engines of both
kinds is the batched sweep below (scripted narrators, the served auditor) and the scripted tests of
the engine pool.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_helpers import FITS, REFERENCE, ReferenceSweep, small_overrides
from ncp_local.protocol import ROLES
from ncp_local.rundir.turn_log import read_log
from served import SERVED_NAME, Relay

ROOT = Path(__file__).resolve().parents[2]
# The reference's config: the server dies with turn 0's checkpoint on disk and the resume continues from it.
COMMON = (*REFERENCE, "limit=1")


def _remote(url: str, roles: tuple[str, ...] = ("auditor",)) -> tuple[str, ...]:
    return tuple(
        o
        for role in roles
        for o in (
            f"{role}.engine=openai",
            f"{role}.endpoint.base_url={url}",
            f"{role}.endpoint.model={SERVED_NAME}",
            f"{role}.endpoint.max_retries=2",
            f"{role}.endpoint.backoff_s=0.5",
            # vLLM's own request extensions: the player's plain text is bounded by a regex, as in-process.
            f"{role}.endpoint.vllm_extensions=true",
        )
    )


def _cmd(dataset: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "run.py"), f"dataset.path={dataset}", f"out_dir={out}", *COMMON, *extra]


def _opened(run: Path) -> bool:
    """A turn log whose line 1, the committed opening (turn 0), is whole: the writer writes it by rename."""
    return any(read_log(p, None).checkpoint is not None for p in (run / "checkpoints").glob("*.jsonl"))


def _results(d: Path) -> dict[str, dict]:
    """Each result as written, but for the seal's run identity."""
    out = {}
    for p in sorted((d / "results").glob("*.json")):
        data = json.loads(p.read_text())
        data["seal"].pop("run")  # seals.SEAL
        out[p.name] = data
    return out


@pytest.mark.engine
@pytest.mark.timeout(2400)  # two runs on the served model: minutes each on 2 cores
def test_roles_on_a_served_model_equal_in_process_and_resume_after_the_server_dies(
    served, reference_sweep: ReferenceSweep, tmp_path: Path
) -> None:
    expected = {f"{FITS}.json": _results(reference_sweep.point("baseline"))[f"{FITS}.json"]}
    assert len(expected[f"{FITS}.json"]["turns"]) == 1, "the seed must give an episode that plays its turn"
    dataset = reference_sweep.dataset

    # The served run, with the server gone once turn 0 (the opening) is committed: the resume plays turn 1.
    relay = Relay(served.port)
    relay.start()
    run = tmp_path / "served"
    proc = subprocess.Popen(
        _cmd(dataset, run, *_remote(relay.url, ROLES)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 900
        while not _opened(run):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.2)
        relay.kill()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        relay.kill()
    assert proc.returncode == 3, err[-3000:]
    # One error line (the engine log's last relevant lines follow it, indented).
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: engine died: endpoint 'smollm2-135m-instruct'")
    assert "unreachable after 3 tries" in line
    assert line.endswith(f"every committed turn is checkpointed in {run}; re-run the same command to resume"), line
    assert not list((run / "results").glob("*.json")) and list((run / "checkpoints").glob("*.jsonl"))
    # The retries before giving up were logged with their backoff (the run's engine.log: a quiet terminal).
    log = (run / "engine.log").read_text(errors="replace")
    assert "retry 1 of 2 in 0.5 s" in log and "retry 2 of 2 in 1.0 s" in log, log[-3000:]

    relay.start()
    try:
        again = subprocess.run(
            _cmd(dataset, run, *_remote(relay.url, ROLES)), capture_output=True, text=True, timeout=1800
        )
    finally:
        relay.kill()
    assert again.returncode == 0, again.stderr[-3000:]
    assert _results(run) == expected

    manifest = json.loads((run / "manifest.json").read_text())
    models = manifest["models"]
    assert [models[r]["engine"] for r in ROLES] == ["openai"] * 3
    for role in ROLES:
        endpoint = models[role]["endpoint"]
        assert endpoint["base_url"] == relay.url and endpoint["served_model"] == SERVED_NAME
        assert [m["id"] for m in endpoint["models"]] == [SERVED_NAME] and endpoint["version"].startswith("0.")
        # The identity names the served model by what the server reports, not by its address.
        part = manifest["identity_parts"]["models"][role]
        assert part["engine"] == "openai" and part["served_model"] == SERVED_NAME
        assert part["reported"]["id"] == SERVED_NAME and part["reported"]["max_model_len"] == 8192
    assert relay.url not in json.dumps(manifest["identity_parts"])
    # The resume was recorded, and every role's calls were answered (by the server: no engine in the run).
    assert len(manifest["resumes"]) == 1
    calls = [json.loads(line) for line in (run / "calls.jsonl").read_text().splitlines() if line.strip()]
    assert {c["role"] for c in calls if c["error"] is None} == set(ROLES)
    assert "EngineCore" not in (run / "engine.log").read_text(errors="replace")


def test_a_batched_sweep_over_narrators_sends_every_auditor_call_to_the_shared_server(served, tmp_path: Path) -> None:
    """Two narrator model files in one batched sweep (scripted, to stay cheap: the point is the auditor), the
    auditor on the session's server: one endpoint client shared by both points (the sweep's engines), and
    each point's auditor calls answered by it."""
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "-m",
            "hydra/launcher=batched",
            "narrator=smollm2,qwen3",
            "narrator.engine=scripted",
            "player.engine=scripted",
            "max_turns=1",
            "limit=1",
            "progress=false",
            "seed=0",
            *small_overrides("auditor"),
            *_remote(served.url),
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    index = json.loads((sweep / "index.json").read_text())
    rows = index["points"]
    assert [r["status"] for r in rows] == ["done", "done"] and len({r["run_dir"] for r in rows}) == 2
    remote = [e for e in index["engines"] if e["engine"] == "openai"]
    assert len(remote) == 1 and remote[0]["roles"] == ["auditor"], index["engines"]
    assert remote[0]["points"] == sorted(r["job"] for r in rows)
    for row in rows:
        run = Path(row["run_dir"])
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["models"]["auditor"]["endpoint"]["base_url"] == served.url
        assert manifest["models"]["narrator"]["engine"] == "scripted"
        calls = [json.loads(line) for line in (run / "calls.jsonl").read_text().splitlines() if line.strip()]
        audits = [c for c in calls if c["role"] == "auditor"]
        # Answered by the server: none of its errors (a refused schema, a dead endpoint) in the call log.
        assert audits and not [c["error"] for c in audits if "endpoint '" in (c["error"] or "")], audits
