"""Which config keys enter a run's identity: the bookkeeping keys left out of it, and the keys added
after runs existed, with the value at which they stay out (rundir/identity.py hashes the rest)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..protocol import ROLES
from ..protocol.trials import ALL, varied_roles

# Keys that never change what a run computes, so they stay out of its identity
# (ncp_local/rundir/identity.py): where things lie (paths, models_root: content is
# hashed instead), how fast or where it runs, other modes' settings. `limit` is
# out too: episodes are independent, a resume with another limit keeps them.
_PLACEMENT = (
    "path",
    "devices",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "tensor_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "max_num_seqs",
    "enforce_eager",
    "cpu_reserved_cores",
)
NOT_IDENTITY = (
    "mode",
    "out_dir",
    "concurrency",
    "speculative_player",
    "max_invalid_share",
    "progress",
    "progress_every_s",
    "verbose",
    "hydra",
    "limit",
    # Like `limit`: plays are independent, so raising it resumes the run and plays only the new trials.
    # (`trials.vary` is in the identity, unless it is the default: rundir/identity.py.)
    "trials.count",
    "runs",
    "report",
    "compare",  # mode=compare's options: they read runs, never make one
    "review",
    "shard",
    "models_root",
    "dataset.path",
    "prompts.dir",
    "from",
    "plan",
    "engine.delay_s",
    "engine.die_after_calls",
    "engine.base_url",
    "engine.api_key_env",
    "engine.file",
    "engine.wait_s",
    "engine.backoff_s",
    "engine.timeout_s",
    "engine.max_retries",
    "engine.max_concurrency",
    "out",
    "bench",
    "sources",
    "export",
    "status",  # the heartbeat and mode=status: they watch a run, never change it
    "tracker",
    "submission",
    "plant",  # mode=plant's draw: a plant directory's identity holds its items' own digest instead
    *(f"{role}.model.{key}" for role in ROLES for key in _PLACEMENT),
    # A role's engine and endpoint enter the identity as that role's model identity
    # (rundir/identity.py: the engine when it differs from `engine`, the served model and
    # what the server reports), never as a URL; left out here so unchanged configs keep theirs.
    *(f"{role}.{key}" for role in ROLES for key in ("engine", "endpoint")),
)


def _vary_read(value: Any) -> Any:
    """`trials.vary` as the identity holds it: `all`, or the sorted roles (a list of every role is `all`);
    a value the config refuses is kept as given (its own check names it)."""
    try:
        roles = varied_roles(value)
    except (ValueError, TypeError):
        return value
    return ALL if roles == frozenset(ROLES) else sorted(roles)


def _per_type_read(value: Any) -> Any:
    """A per-type share as the identity holds it: one number stands for every type."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return dict.fromkeys(("fact", "commitment", "player_input"), float(value))
    return value


# Keys added after runs existed: the value that plays exactly as before the key existed, and how a
# value reads in the identity. At that value the key (and a section left empty by it) stays out of
# the identity, so a run made before it keeps its identity and resumes; another value is another
# experiment. Labels show the value for a run that has no such key.
LATER_KEYS: dict[str, tuple[Any, Callable[[Any], Any]]] = {
    "audit.failure_modes": (False, lambda value: value),
    "trials.vary": (ALL, _vary_read),
    "engine.context_limit_turn": (None, lambda value: value),
    "engine.context_limit_share": (1.0, lambda value: value),
    # mode=plant's scripted auditor: at the defaults a scripted run keeps the identity it had before them.
    "engine.plant_recall": ({"fact": 0.8, "commitment": 0.8, "player_input": 0.8}, _per_type_read),
    "engine.plant_false_alarm": ({"fact": 0.05, "commitment": 0.05, "player_input": 0.05}, _per_type_read),
    "plant.model": (None, lambda value: value),
    "engine.plant_wrong_id": ({"fact": 0.0, "commitment": 0.0, "player_input": 0.0}, _per_type_read),
    # The scripted engine's text lengths (mode=bench's rig-alone way): 0 is the short texts it always wrote.
    "engine.narration_chars": (0, lambda value: value),
    "engine.player_chars": (0, lambda value: value),
    "engine.reason_chars": (0, lambda value: value),
}
