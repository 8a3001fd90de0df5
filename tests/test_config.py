"""Config groups and the command line: every shipped option composes and
validates; bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from cli_runner import CliResult, run_cli
from ncp_local import config as config_mod

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
ROLE_OPTIONS = sorted(p.stem for p in (CONF / "auditor").glob("*.yaml"))


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> CliResult:
    return run_cli(*args, cwd=cwd, env={**os.environ, **(env or {})})


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return err


def _compose(*overrides: str) -> tuple[config_mod.RunConfig, dict]:
    raw = OmegaConf.to_container(config_mod.compose(list(overrides)), resolve=True)
    return config_mod.validate(raw), raw  # type: ignore[arg-type]


# -- every shipped option composes and validates -----------------------------


def test_role_options_exist_for_every_role() -> None:
    assert {"qwen3", "qwen3_32b", "llama3_1_8b", "gemma3_12b", "mistral_small_24b", "smollm2"} <= set(ROLE_OPTIONS)
    for role in ("narrator", "player"):
        assert sorted(p.stem for p in (CONF / role).glob("*.yaml")) == ROLE_OPTIONS


@pytest.mark.parametrize("option", ROLE_OPTIONS)
def test_role_option_composes_and_validates(option: str) -> None:
    cfg, _ = _compose(f"narrator={option}", f"player={option}", f"auditor={option}", "models_root=/m")
    for role in (cfg.narrator, cfg.player, cfg.auditor):
        m = role.model
        assert m.path == "embedded" or m.path.startswith("/m/"), m.path
        assert m.name and m.max_model_len > 0
        # Every model file leaves its share to the plan (None): a fixed share in a model file would
        # take that share of every GPU it lands on (the embedded player beside a GPU narrator).
        assert m.gpu_memory_utilization is None, m


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
def test_model_files_have_every_field(model: str) -> None:
    doc = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{model}.yaml"))
    fields = {
        "name",
        "path",
        "dtype",
        "max_model_len",
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "devices",
        "chat_template_kwargs",
        "structured_outputs_backend",
        "enforce_eager",
        "max_num_seqs",
        "trust_remote_code",
        "thinking",
        "reasoning_parser",
        "thinking_budget",
    }
    assert fields <= set(doc), fields - set(doc)  # type: ignore[arg-type]
    if model.startswith("qwen3"):
        assert doc["chat_template_kwargs"] == {"enable_thinking": False}  # type: ignore[index]
        assert doc["reasoning_parser"] == "qwen3"  # type: ignore[index]
    assert doc["thinking"] is False  # thinking is off in every file (the paper's settings)
    assert doc["trust_remote_code"] is (model == "kimi_k2_5")  # only where the tokenizer is the model's own code
    if model != "smollm2":
        assert doc["path"].startswith("${models_root}/") and "revision" in doc  # type: ignore[index, operator]


def test_qwen3_auditor_follows_models_root() -> None:
    cfg, _ = _compose("auditor=qwen3", "models_root=/data/models")
    assert cfg.auditor.model.path == "/data/models/Qwen/Qwen3-8B"
    assert cfg.auditor.model.chat_template_kwargs == {"enable_thinking": False}
    assert cfg.narrator.model.path == "embedded"


def test_auditor_sensitivity_sweeps_auditors() -> None:
    cfg = config_mod.compose(["experiment=auditor_sensitivity"], hydra_config=True)
    swept = str(cfg.hydra.sweeper.params.auditor).split(",")
    assert len(swept) >= 3 and set(swept) <= set(ROLE_OPTIONS)
    run, _ = _compose("experiment=auditor_sensitivity")
    assert run.narrator.model.name == run.player.model.name == "qwen3-8b"
    assert run.narrator.model.devices != run.auditor.model.devices


def test_submitit_launcher_config_composes() -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = config_mod.compose(["hydra/launcher=ncp_slurm"], hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["_target_"].endswith("SlurmLauncher")  # type: ignore[index]
    assert launcher["max_num_timeout"] > 0  # type: ignore[index, operator]
    assert any("HF_HUB_OFFLINE=1" in line for line in launcher["setup"])  # type: ignore[index, union-attr]


# -- the command line -----------------------------------------------------------


def test_cfg_job_resolves_qwen3_auditor(tmp_path: Path) -> None:
    proc = _run("auditor=qwen3", "--cfg", "job", "--resolve", cwd=tmp_path, env={"NCP_MODELS_ROOT": "/x"})
    assert proc.returncode == 0, proc.stderr
    auditor = OmegaConf.create(proc.stdout).auditor
    assert auditor.model.name == "qwen3-8b" and auditor.model.path == "/x/Qwen/Qwen3-8B"
    assert auditor.model.chat_template_kwargs.enable_thinking is False


@pytest.mark.engine_libs
def test_missing_weights_stop_before_any_engine(tmp_path: Path) -> None:
    proc = _run("auditor=qwen3", "progress=false", cwd=tmp_path, env={"NCP_MODELS_ROOT": str(tmp_path / "none")})
    err = _one_line_error(proc)
    assert "auditor.model.path" in err and str(tmp_path / "none" / "Qwen" / "Qwen3-8B") in err
    assert not (tmp_path / "runs").exists()  # nothing written, nothing started


# Bad overrides, one case per kind: tests/test_bad_input.py (the bad-input table).


def test_multirun_sweep_still_runs(tmp_path: Path) -> None:
    proc = _run("-m", "engine=scripted", "max_turns=1", "limit=1", "progress=false", "seed=1,2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_sweep_from_experiment_file_runs(tmp_path: Path) -> None:
    # Scripted engine: no weights needed; one run directory per auditor backbone.
    proc = _run(
        "-m",
        "experiment=auditor_sensitivity",
        "engine=scripted",
        "max_turns=1",
        "limit=1",
        "progress=false",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    swept = str(
        config_mod.compose(["experiment=auditor_sensitivity"], hydra_config=True).hydra.sweeper.params.auditor
    ).split(",")
    assert len(list((tmp_path / "runs").iterdir())) == len(swept)


def test_merge_of_unsharded_dir_is_one_line(tmp_path: Path) -> None:
    err = _one_line_error(_run("mode=merge", f"out_dir={tmp_path / 'nothing'}", cwd=tmp_path))
    assert "shard" in err
