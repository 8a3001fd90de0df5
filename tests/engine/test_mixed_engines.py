"""Each role on its own engine, on the real thing: narrator and player in-process on the embedded
model, the auditor on the session's `vllm serve` of the same model (tests/engine/served.py).

The mixed run's results are byte for byte those of the all-in-process run of the same config (seal
aside: it names the run identity, which differs by the auditor's engine): the server runs the
engine arguments the rig's engine runs (engines/serve.py), renders the same chat template, takes
the same per-call seed and sampling, and compiles the same JSON schema with the same backend and
whitespace rule; fp32 on the CPU build is batch-invariant. The server killed mid-run ends the run
like an engine death (exit 3); started again, the same command resumes to the same results.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from served import SERVED_NAME

ROOT = Path(__file__).resolve().parents[2]
KV = 1 << 30
# One spec, two turns; the seed gives an episode that commits turn 0 and plays turn 1 (asserted), so
# the server dies with a checkpoint on disk and the resume continues from it.
COMMON = ("max_turns=2", "limit=1", "progress=false", "seed=0",
          *(f"+{role}.model.kv_cache_memory_bytes={KV}" for role in ("narrator", "player", "auditor")))


def _remote(url: str) -> tuple[str, ...]:
    return ("auditor.engine=openai", f"auditor.endpoint.base_url={url}", f"auditor.endpoint.model={SERVED_NAME}",
            "auditor.endpoint.max_retries=2", "auditor.endpoint.backoff_s=0.5")


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "run.py"), f"out_dir={out}", *COMMON, *extra]


def _results(d: Path) -> dict[str, dict]:
    """Each result as written, but for the seal's run identity."""
    out = {}
    for p in sorted((d / "results").glob("*.json")):
        data = json.loads(p.read_text())
        data["seal"].pop("run")  # store.SEAL
        out[p.name] = data
    return out


def test_auditor_on_a_served_model_equals_in_process_and_resumes_after_the_server_dies(served, tmp_path: Path) -> None:
    ref = subprocess.run(_cmd(tmp_path / "ref"), capture_output=True, text=True, timeout=1800)
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = _results(tmp_path / "ref")
    (result,) = expected.values()
    assert len(result["turns"]) == 2, "the seed must give an episode that plays both turns (see COMMON)"

    # The mixed run, with the server killed once turn 0 is committed (its checkpoint is on disk).
    mixed = tmp_path / "mixed"
    proc = subprocess.Popen(_cmd(mixed, *_remote(served.url)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 900
        while not list((mixed / "checkpoints").glob("*.json")):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.2)
        served.kill()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: engine died: endpoint 'smollm2-135m-instruct'") and "unreachable after 3 tries" in last
    assert last.endswith(f"every committed turn is checkpointed in {mixed}; re-run the same command to resume"), last
    assert not list((mixed / "results").glob("*.json")) and list((mixed / "checkpoints").glob("*.json"))
    # The retries before giving up were logged with their backoff (the run's engine.log: a quiet terminal).
    log = (mixed / "engine.log").read_text(errors="replace")
    assert "retry 1 of 2 in 0.5 s" in log and "retry 2 of 2 in 1.0 s" in log, log[-3000:]

    served.start()
    again = subprocess.run(_cmd(mixed, *_remote(served.url)), capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _results(mixed) == expected

    manifest = json.loads((mixed / "manifest.json").read_text())
    models = manifest["models"]
    assert [models[r]["engine"] for r in ("narrator", "player", "auditor")] == ["vllm", "vllm", "openai"]
    endpoint = models["auditor"]["endpoint"]
    assert endpoint["base_url"] == served.url and endpoint["served_model"] == SERVED_NAME
    assert [m["id"] for m in endpoint["models"]] == [SERVED_NAME] and endpoint["version"].startswith("0.")
    # The identity names the served model by what the server reports, not by its address.
    auditor = manifest["identity_parts"]["models"]["auditor"]
    assert auditor["engine"] == "openai" and auditor["served_model"] == SERVED_NAME
    assert auditor["reported"]["id"] == SERVED_NAME and auditor["reported"]["max_model_len"] == 8192
    assert served.url not in json.dumps(manifest["identity_parts"])
    # The resume was recorded, and the auditor's calls of the resumed run went to the server.
    assert len(manifest["resumes"]) == 1
    calls = [json.loads(line) for line in (mixed / "calls.jsonl").read_text().splitlines() if line.strip()]
    assert {c["role"] for c in calls} == {"narrator", "player", "auditor"}
