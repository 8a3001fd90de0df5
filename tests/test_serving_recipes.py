"""docs/guide/serving.md's "Three recipes" work as the page prints them, for a user with the weights on disk.

The command lines are read from the page (tests/documented_commands.py), so a recipe edited into one that
no longer works fails here. The two Slurm recipes run through the submitter's dry run with no
`--skip-model-check`: every model folder they name is on disk (its `config.json`, with the model's own
figures: layers, attention heads, window, and so on), so the served layout's split, the model paths and the
engines are checked as a real submission checks them; once as printed, and once with `plan.gpus` for the
H100-80GB task GPUs the page gives them, so the memory plan is checked too. The hosted-auditor recipe needs a
server: its overrides go through the run's pre-flight with the models on disk and no endpoint asked.
(tests/test_documented_commands.py runs every page's lines too, with `--skip-model-check` for models not
here: that path never reads a model's config.json.)
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_submit
from documented_commands import ROOT, Command, commands_in
from ncp_local import config as config_mod
from ncp_local import plan
from ncp_local.bindings import bind
from ncp_local.execution import points

PAGE = ROOT / "docs" / "guide" / "serving.md"
SECTION = "## Three recipes"
GPU = "H100-80GB"  # the GPU the recipes are costed on
# Where the Makefile looks for the official release when NCP_BENCH_DATASET is not set.
MAKE_DATASET = ROOT.parent / "shared" / "ncp-bench" / "dataset"


def _recipes() -> list[Command]:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)]
    # Line numbers as on the page.
    return commands_in("\n" * text[:start].count("\n") + section, str(PAGE.relative_to(ROOT)))


RECIPES = _recipes()
SLURM = [c for c in RECIPES if c.script == "slurm/submit.py"]
HOSTED = [c for c in RECIPES if c.script == "run.py"]


# Each model folder's config.json, as the model's own says (the fields the rig and vLLM read for the plan
# and the split). A recipe naming a model not here fails with its folder named: add its figures.
QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "vocab_size": 151936}
CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek-ai/DeepSeek-V3.2": {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "num_hidden_layers": 61,
        "num_nextn_predict_layers": 1,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "moe_intermediate_size": 2048,
        "intermediate_size": 18432,
        "index_head_dim": 128,
        "index_n_heads": 64,
        "index_topk": 2048,
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
    },
    "Qwen/Qwen3-8B": {
        **QWEN3,
        "num_hidden_layers": 36,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-32B": {
        **QWEN3,
        "num_hidden_layers": 64,
        "hidden_size": 5120,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-30B-A3B": {
        **QWEN3,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
    },
    "meta-llama/Llama-3.1-8B-Instruct": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "vocab_size": 128256,
        "torch_dtype": "bfloat16",
    },
    "mistralai/Mistral-Small-24B-Instruct-2501": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "vocab_size": 131072,
        "torch_dtype": "bfloat16",
    },
    "google/gemma-3-12b-it": {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "gemma3_text",
            "num_hidden_layers": 48,
            "hidden_size": 3840,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "sliding_window": 1024,
            "max_position_embeddings": 131072,
            "vocab_size": 262208,
        },
    },
}
PLACEHOLDER_ROOT = "/models-root-of-the-recipe"


def _dataset() -> str:
    path = os.environ.get("NCP_BENCH_DATASET") or str(MAKE_DATASET)
    if not Path(path).is_dir():
        if os.environ.get("NCP_REQUIRE_DATASET"):
            pytest.fail(f"official dataset not found at {path} (NCP_REQUIRE_DATASET is set: CI needs it)")
        pytest.skip(f"the recipes name dataset=ncp_bench: official dataset not found at {path}")
    return path


def _split(cmd: Command) -> tuple[list[str], list[str]]:
    """The submitter's own options and the overrides after `--`."""
    args = list(cmd.args)
    cut = args.index("--") if "--" in args else len(args)
    return args[:cut], args[cut + 1 :]


def _option(options: list[str], name: str, default: int) -> int:
    return int(options[options.index(name) + 1]) if name in options else default


def _model_folders(overrides: list[str]) -> set[str]:
    """The model folders (under models_root) every role of every point names."""
    overrides = [o for o in overrides if o not in ("-m", "--multirun")]
    grid = points.expand([*overrides, f"models_root={PLACEHOLDER_ROOT}"])
    found = set()
    for point in grid.points(most=64):
        cfg = config_mod.validate(points.load(list(point.overrides)))
        for role in ("narrator", "player", "auditor"):
            path = getattr(cfg, role).model.path
            if path.startswith(PLACEHOLDER_ROOT + "/"):
                found.add(path[len(PLACEHOLDER_ROOT) + 1 :])
    return found


@pytest.fixture()
def models_root(tmp_path: Path) -> Path:
    """Every model folder the recipes name, each with its config.json (no weights: the plan takes their
    size from its built-in facts, as it does for a folder whose weights are still downloading)."""
    root = tmp_path / "models"
    named: set[str] = set()
    for cmd in RECIPES:
        named |= _model_folders(_split(cmd)[1] if cmd.script == "slurm/submit.py" else list(cmd.args))
    unknown = sorted(named - set(CONFIGS))
    assert not unknown, f"a recipe names model folders this test has no config.json for: {unknown}"
    for folder in named:
        (root / folder).mkdir(parents=True)
        (root / folder / "config.json").write_text(json.dumps(CONFIGS[folder]), encoding="utf-8")
    return root


def test_the_page_has_its_three_recipes() -> None:
    assert [c.script for c in RECIPES] == ["slurm/submit.py", "slurm/submit.py", "run.py"], [c.text for c in RECIPES]
    assert all(c.needs for c in RECIPES)


def _dry_run(cmd: Command, models_root: Path, cwd: Path, extra: list[str]) -> tuple[Any, list[str], list[str]]:
    options, overrides = _split(cmd)
    args = [*options, "--dry-run", "--", *overrides, *extra]
    env = {**os.environ, "NCP_MODELS_ROOT": str(models_root), "NCP_BENCH_DATASET": _dataset()}
    env.pop("NCP_LOCAL_CACHE", None)
    return run_submit(*args, cwd=cwd, env=env), options, overrides


def _served_args(stdout: str) -> list[str]:
    """The server's command line, as the dry run prints it (`  <args file>: <command>`)."""
    line = next(x for x in stdout.splitlines() if re.match(r"\s+\S+serve-\w+\.args: ", x))
    return shlex.split(line.split(": ", 1)[1])


@pytest.mark.parametrize("cmd", SLURM, ids=[f"line-{c.line}" for c in SLURM])
def test_a_slurm_recipe_dry_runs_as_printed_with_its_weights_on_disk(
    cmd: Command, models_root: Path, tmp_path: Path
) -> None:
    done, options, _ = _dry_run(cmd, models_root, tmp_path, [])
    assert done.returncode == 0, f"{cmd.where}: exit {done.returncode}\n{cmd.text}\n{done.stderr}"
    # The served layout the recipe asks for, on the weights on disk.
    nodes, gpus = _option(options, "--serve-nodes", 1), _option(options, "--serve-gpus", 0)
    served = _served_args(done.stdout)
    assert Path(served[3]).is_relative_to(models_root), served
    assert served[served.index("--tensor-parallel-size") + 1] == str(gpus)
    assert ("--pipeline-parallel-size" in served) == (nodes > 1)
    if nodes > 1:
        assert served[served.index("--pipeline-parallel-size") + 1] == str(nodes)
    server = next(x for x in done.stdout.splitlines() if x.startswith("server: "))
    assert f"--nodes={nodes} " in server and f"--gres=gpu:{gpus} " in server
    array = next(x for x in done.stdout.splitlines() if x.startswith("array: "))
    assert f"--gres=gpu:{_option(options, '--gpus', 0)} " in array
    # The tasks' GPUs are not this machine's to plan for, unless it has some: it says so, and plans nothing.
    unplanned = "plan: not checked here: the tasks ask for GPUs" in done.stdout
    assert unplanned == (plan.inventory(None).kind == "cpu"), done.stdout


@pytest.mark.parametrize("cmd", SLURM, ids=[f"line-{c.line}" for c in SLURM])
def test_a_slurm_recipe_fits_the_gpus_the_page_costs_it_on(cmd: Command, models_root: Path, tmp_path: Path) -> None:
    options, _ = _split(cmd)
    task = f"plan.gpus=[{_option(options, '--gpus', 0)}x{GPU}]"
    done, _, _ = _dry_run(cmd, models_root, tmp_path, [task])
    assert done.returncode == 0, f"{cmd.where} with {task}: exit {done.returncode}\n{cmd.text}\n{done.stderr}"
    assert "plan: not checked here" not in done.stdout


def test_the_served_split_is_refused_only_where_a_stage_would_hold_no_layer(models_root: Path, tmp_path: Path) -> None:
    """The recipe's 61-layer model on 2 nodes is split unevenly by vLLM (31 + 30); 62 nodes leave one empty."""
    cmd = SLURM[0]
    options, overrides = _split(cmd)
    assert "--serve-nodes" in options
    at = options.index("--serve-nodes") + 1
    too_many = Command(
        cmd.page, cmd.line, cmd.text, cmd.script, (*options[:at], "62", *options[at + 1 :], "--", *overrides), ""
    )
    done, _, _ = _dry_run(too_many, models_root, tmp_path, [])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stdout + done.stderr
    assert done.stderr.startswith("error: --serve-nodes 62: deepseek-v3.2 has 61 layers, fewer than 62"), done.stderr


@pytest.mark.parametrize("cmd", HOSTED, ids=[f"line-{c.line}" for c in HOSTED])
def test_the_hosted_auditor_recipe_passes_the_pre_flight(
    cmd: Command, models_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything a run of it checks before it starts, but the server (no network here); narrator and player
    on one H100-80GB; the auditor on the page's endpoint with the paper's settings (Table 1's)."""
    monkeypatch.setenv("NCP_MODELS_ROOT", str(models_root))
    monkeypatch.setenv("NCP_BENCH_DATASET", _dataset())
    overrides = [*cmd.args, f"plan.gpus=[1x{GPU}]"]
    key = next(o.split("=", 1)[1] for o in cmd.args if o.startswith("auditor.endpoint.api_key_env="))
    monkeypatch.delenv(key, raising=False)
    with pytest.raises(config_mod.ConfigError, match=f"environment variable {key} is not set"):
        points.check(points.load(overrides), models=True, endpoints=False)
    monkeypatch.setenv(key, "a key")
    checked = points.check(points.load(overrides), models=True, endpoints=False)
    assert checked.ready is not None
    roles = bind(checked.cfg).roles
    assert [roles[r].engine for r in ("narrator", "player", "auditor")] == ["vllm", "vllm", "openai"]
    assert roles["auditor"].endpoint["base_url"] in cmd.text and roles["auditor"].endpoint["model"] in cmd.text
    # For a comparison with Table 1: the paper's turns, dataset and unbounded auditor answers.
    assert checked.cfg.max_turns == 100 and Path(config_mod.dataset_path(checked.cfg)) == Path(_dataset())
    bounds = roles["auditor"].bounds
    assert all(getattr(bounds, f) is None for f in type(bounds).model_fields), bounds
