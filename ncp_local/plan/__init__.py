"""The memory, KV and window plan: will this config fit its GPUs and its context windows, before
anything loads? (vLLM's own sizing rules; `mode=plan` prints it, modes/plan.py.)

For the resolved config the plan shows each engine (model, the roles that
share it, devices, tensor parallel, memory share), its weights and KV cache
per token, the KV capacity in tokens and in episodes at once, the prompt
length each stage reaches by turn, the first turn a call no longer fits its
window, and a verdict. Every job's pre-flight (execution/preflight.py) makes
the same memory and window checks first (`planned`, no prompt play, fast)
and starts the engines with the planned shares and devices.

Verdicts: 0 go; 1 it would start, but some call outgrows its window before
`max_turns` (those episodes end `context_limit`); 2 it cannot start as
configured (the one line says what to change). May import config, protocol
and engines.

The package face: `_check` makes the plan (`check`, `planned`, `project`, `verdict`), `_render` prints it;
`memory`, `gpus` (with `gpu_shares` and `gpu_fixes`), `kv`, `facts` (read by `checkpoint`, else from
`known_models`), `growth` and `hardware` hold the sizing rules it applies.
"""

from ._check import (
    CANNOT,
    GO,
    KV_BOUND_EPISODES,
    OVERFLOW,
    Plan,
    StageRow,
    check,
    footprint_at,
    planned,
    project,
    thinking_reserve,
    verdict,
)
from ._render import render
from .checkpoint import model_facts
from .facts import ModelFacts
from .growth import Line, fit_line
from .hardware import Gpu, inventory, parse_gpu
from .memory import share_is_planned

__all__ = [
    "CANNOT",
    "GO",
    "KV_BOUND_EPISODES",
    "OVERFLOW",
    "Gpu",
    "Line",
    "ModelFacts",
    "Plan",
    "StageRow",
    "check",
    "fit_line",
    "footprint_at",
    "inventory",
    "model_facts",
    "parse_gpu",
    "planned",
    "project",
    "render",
    "share_is_planned",
    "thinking_reserve",
    "verdict",
]
