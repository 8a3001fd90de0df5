"""The devices a plan is made for: `plan.gpus` when given, else `nvidia-smi`, else this CPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from ..config import ConfigError

GIB = 2**30
_OVERRIDE = re.compile(r"^\s*(?P<name>.*?)[-_ ]?(?P<size>\d+(?:\.\d+)?)\s*(?:GB|GiB|G)\s*$", re.IGNORECASE)
# `8xH200-141GB`: a count of identical GPUs (a node), the same as listing the GPU 8 times.
_COUNT = re.compile(r"^\s*(?P<count>\d+)\s*[x*]\s*(?P<gpu>.+)$", re.IGNORECASE)
# More GPUs than any one node holds: a count above this is a typo, not an inventory.
MAX_GPU_COUNT = 64


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int
    used_bytes: int = 0


@dataclass(frozen=True)
class Inventory:
    kind: Literal["gpu", "cpu"]
    gpus: tuple[Gpu, ...]
    ram_bytes: int
    source: str

    def describe(self) -> str:
        if self.kind == "cpu":
            return f"CPU, {self.ram_bytes / GIB:.1f} GiB RAM on NUMA node 0 ({self.source})"
        names: dict[str, int] = {}
        for g in self.gpus:
            label = f"{g.name} {g.total_bytes / GIB:.0f} GiB"
            names[label] = names.get(label, 0) + 1
        return ", ".join(f"{n} x {label}" for label, n in names.items()) + f" ({self.source})"


def parse_gpu(text: str, field: str = "plan.gpus") -> Gpu:
    """`H100-80GB` -> a GPU named H100 with 80 GiB (what the card reports is a little under that)."""
    m = _OVERRIDE.match(str(text))
    if not m:
        raise ConfigError(
            field, f"cannot read GPU {text!r}: write NAME-<N>GB, e.g. H100-80GB or A100-40GB (8 of them: 8xH100-80GB)"
        )
    return Gpu(name=m.group("name") or "GPU", total_bytes=int(float(m.group("size")) * GIB))


def parse_gpus(text: str, field: str = "plan.gpus") -> list[Gpu]:
    """One entry of `plan.gpus`: `H100-80GB` (one GPU) or `8xH200-141GB` (eight)."""
    m = _COUNT.match(str(text))
    if not m:
        return [parse_gpu(text, field)]
    count = int(m.group("count"))
    if not 1 <= count <= MAX_GPU_COUNT:
        raise ConfigError(
            field, f"cannot read GPU count {count} in {text!r}: write 1 to {MAX_GPU_COUNT}, e.g. 8xH200-141GB"
        )
    return [parse_gpu(m.group("gpu"), field)] * count


NODE0_MEMINFO = "/sys/devices/system/node/node0/meminfo"


def ram_bytes() -> int:
    """The memory vLLM's CPU build takes its share of: NUMA node 0's total where the node is listed."""
    try:
        with open(NODE0_MEMINFO, encoding="ascii") as f:
            for line in f:
                parts = line.split()  # "Node 0 MemTotal: 18573048 kB"
                if len(parts) >= 4 and parts[2] == "MemTotal:":
                    return int(parts[3]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _visible(rows: list[tuple[str, str, Gpu]]) -> list[Gpu]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES (Slurm's allocation) by index or UUID, in its order."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return [g for _, _, g in rows]
    out = []
    for item in (x.strip() for x in mask.split(",") if x.strip()):
        for index, uuid, g in rows:
            if item == index or (item.startswith(("GPU-", "MIG-")) and uuid.startswith(item)):
                out.append(g)
                break
    return out


def nvidia_smi() -> list[Gpu] | None:
    """The visible GPUs per nvidia-smi; None when there is no working nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,uuid,name,memory.total,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    rows = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        try:
            rows.append(
                (
                    parts[0],
                    parts[1],
                    Gpu(
                        name=parts[2], total_bytes=int(float(parts[3])) * 2**20, used_bytes=int(float(parts[4])) * 2**20
                    ),
                )
            )
        except ValueError:
            continue
    return _visible(rows)


def inventory(gpus: list[str] | None) -> Inventory:
    if gpus is not None:
        parsed = tuple(g for i, text in enumerate(gpus) for g in parse_gpus(text, f"plan.gpus[{i}]"))
        if not parsed:
            return Inventory("cpu", (), ram_bytes(), "plan.gpus=[]")
        return Inventory("gpu", parsed, ram_bytes(), "from plan.gpus")
    found = nvidia_smi()
    if found:
        return Inventory("gpu", tuple(found), ram_bytes(), "from nvidia-smi")
    return Inventory("cpu", (), ram_bytes(), "no nvidia-smi and no plan.gpus")
