"""The one check before anything starts, for every entry point (run, sweeps, bench, build,
re-audit, the Slurm submitter).

In order: the `engine_args` keys, the memory and window plan (`ncp_local.plan`), the dataset, the
narrator method and its options, the player condition, the prompt pack, and
the engines (packages, API key, model paths, every stage's grammar on its
backend). A failure is an `InputError`: one line naming the
file or key, exit code 2, before any model loads and before anything is
written.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import plan
from ..bindings import Bindings, bind
from ..config import ConfigError, RunConfig, dataset_path
from ..engines import registry
from ..engines.grammar import id_form, unsupported
from ..engines.settings import EMBEDDED, ModelSettings
from ..protocol import ROLES
from ..protocol.narrators import narrator_factory, narrator_options
from ..protocol.player import Player
from ..protocol.prompts import TEMPLATES, PromptPack
from ..protocol.spec import Dataset, load_dataset
from ..protocol.stages import STAGES, AuditIds, Bounds, schema_for
from . import endpoints as endpoints_mod
from .projection import play
from .ready import Ready

# The structured-output backends vLLM compiles grammars with (engines/grammar.py): the package
# each needs. An engine's own package, its dependencies and the install fix are in its registry row.
BACKEND_PACKAGES = {"xgrammar": "xgrammar", "guidance": "llguidance", "outlines": "outlines_core"}


def preflight(
    cfg: RunConfig,
    roles: tuple[str, ...] = ROLES,
    *,
    episodes: bool = True,
    templates: Iterable[str] = TEMPLATES,
    models: bool = True,
    datasets: dict[str, Dataset] | None = None,
    endpoints: bool = True,
    memory_plan: bool = True,
) -> Ready:
    """Everything a job would refuse at its start, checked without starting anything.

    `episodes`: the job plays episodes (dataset, narrator method, player); `models`: check
    the plan and the engines (the Slurm submitter skips them when the models live on the
    compute nodes only); `datasets`: a cache by path, for a sweep that checks many points;
    `endpoints`: ask the roles' servers (the Slurm submitter queues the server it would ask);
    `memory_plan`: with `models`, plan memory on this machine's hardware (the Slurm submitter skips
    it when the tasks' GPUs are not this machine's to know: their own start plans on them).
    """
    given = bindings = bind(cfg)
    if models:
        # The plan reads engine_args (the KV cache's size and dtype): a misspelt key is named
        # before a plan made without it can refuse the run for another reason.
        check_engine_args(given, roles)
    if models and memory_plan:
        planned = plan.planned(cfg, roles)
        if planned != cfg:
            cfg, bindings = planned, bind(planned)
    dataset = narrator_cls = player = None
    kwargs: dict[str, Any] = {}
    needed = (*templates, *cfg.optional_templates)
    if episodes:
        dataset = _dataset(cfg, datasets)
        narrator_cls = narrator_factory(cfg.method_name)
        kwargs = narrator_options(narrator_cls, cfg.method_options)  # refused here, before any engine starts
        needed += tuple(getattr(narrator_cls, "TEMPLATES", ()))
        player = Player(cfg.condition_name)
    pack = PromptPack.load(cfg.prompts.get("dir"), required=needed)
    ready = Ready(cfg, pack, dataset, narrator_cls, kwargs, player, {}, bindings, given)
    if models:
        check_engines(bindings, roles)
        remote = bindings.served(roles)
        if remote and endpoints:

            def growth() -> Any:
                # The window check plays the opening and turn 1 with the rig's prompts (as mode=plan does).
                if not episodes:
                    return None
                return play(ready, cfg.plan.model_copy(update={"fit_turns": 2}))

            ready = replace(ready, endpoints=endpoints_mod.check(bindings, remote, growth))
    return ready


def plan_growth(cfg: RunConfig) -> Any:
    """The one planning function (mode=plan, and the report's projection of a recorded run): the prompt
    growth the plan fits, played on the config's dataset, method, player condition and prompt pack.
    Only those episode inputs are checked (InputError); no engine, model or endpoint is asked."""
    return play(preflight(cfg, models=False), cfg.plan)


def _dataset(cfg: RunConfig, cache: dict[str, Dataset] | None) -> Dataset:
    path = dataset_path(cfg)
    key = f"{path}|{cfg.limit}"
    if cache is not None and key in cache:
        return cache[key]
    ds = load_dataset(path, limit=cfg.limit)
    if cache is not None:
        cache[key] = ds
    return ds


def check_engines(bindings: Bindings, roles: tuple[str, ...] = ROLES) -> None:
    """Each role's engine: its package and API key; for in-process roles every local model path and
    every stage's grammar on its structured-output backend (`engine_args`: `check_engine_args`,
    before the plan). (Endpoints are asked what they serve afterwards: `endpoints.check`.)"""
    kinds = {role: bindings[role].engine for role in roles}
    for name in dict.fromkeys(kinds.values()):
        row = registry.kind(name)
        if row.package is None:
            continue
        # First, before anything that needs the engine's packages (the grammar check below).
        key = "engine" if bindings.engine.name == name else f"{next(r for r in roles if kinds[r] == name)}.engine"
        if importlib.util.find_spec(row.package) is None:
            raise ConfigError(
                key, f"engine={name} needs the {row.package} package, which is not installed: {row.install}"
            )
        # What the package itself imports to run (its tensors; an in-process engine's grammar compilers):
        # one missing means the engine is not importable, which is what the line must say (not the grammar
        # check's "xgrammar is not installed", which would send the user after the wrong package).
        needed = row.requires + tuple(
            BACKEND_PACKAGES.get(bindings[role].model.structured_outputs_backend, "")
            for role in roles
            if row.in_process and kinds[role] == name
        )
        missing = [dep for dep in dict.fromkeys(needed) if dep and importlib.util.find_spec(dep) is None]
        if missing:
            raise ConfigError(
                key,
                f"engine={name}: the {row.package} package is not importable (its dependency "
                f"{missing[0]} is not installed): {row.install}",
            )
    for role in roles:
        if not registry.kind(kinds[role]).served:
            continue
        key_env = bindings[role].endpoint.get("api_key_env")
        if key_env and not os.environ.get(key_env):
            raise ConfigError(
                bindings[role].endpoint_field("api_key_env"), f"environment variable {key_env} is not set"
            )
    models = {role: bindings[role].model for role in bindings.in_process(roles)}
    for role, model in models.items():
        problem = None if model.path == EMBEDDED else _model_dir_problem(Path(model.path).expanduser())
        if problem:
            raise ConfigError(
                f"{role}.model.path",
                f"model {model.name!r}: {model.path}: {problem} "
                "(set models_root or NCP_MODELS_ROOT, or override the path)",
            )
    for role, model in models.items():
        _check_thinking(role, model)
        _check_format(role, model)
        if model.path == EMBEDDED:
            _check_embedded_bounds(role, bindings[role].bounds)
    for role in models:
        _check_grammars(role, models[role].structured_outputs_backend, bindings[role].bounds)


def _check_embedded_bounds(role: str, bounds: Bounds | None) -> None:
    """The embedded 135M model keeps writing inside a string until its bound: with none at all (as
    `experiment=paper` sets, for the paper's real models) a narration runs to max_tokens, some
    7,000 tokens, and a run takes hours per story on a CPU to measure nothing. Refused, not slowed."""
    if bounds is not None and any(v is not None for v in bounds.model_dump().values()):
        return
    raise ConfigError(
        f"{role}.bounds",
        f"every output bound is lifted (experiment=paper does this) but {role} runs "
        "the embedded 135M model, which then writes until max_tokens (thousands of tokens a call, "
        f"hours per story on a CPU): give {role} a real model ({role}.model=<model file>, see "
        "docs/guide/paper-experiments.md), or drop experiment=paper to keep the embedded model's bounds",
    )


def _model_dir_problem(path: Path) -> str | None:
    """Why `path` cannot be a local model folder (vLLM reads config.json, or params.json in Mistral format)."""
    try:
        if not path.exists():
            return "no such path"
        if not path.is_dir():
            return "is a file, not a model folder"
        if not any(path.iterdir()):
            return "is an empty folder"
        if not ((path / "config.json").is_file() or (path / "params.json").is_file()):
            return "has no config.json: not a model folder"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    return None


# Mistral-format files in a model folder: vLLM 0.33 then picks its Mistral loaders on its own
# (load_format, config_format and tokenizer_mode `auto`: consolidated*.safetensors, params.json and
# tekken.json; default_loader.py, transformers_utils/config.py get_config, tokenizers/registry.py
# resolve_tokenizer_args), while the rig renders and counts prompts with the Hugging Face tokenizer
# and chat template in the same folder. So the format is pinned to Hugging Face's.
MISTRAL_FILES = ("consolidated*.safetensors", "params.json", "tekken.json")
HF_FORMAT = {"tokenizer_mode": "hf", "config_format": "hf", "load_format": "safetensors"}


def _check_format(role: str, model: ModelSettings) -> None:
    """A folder with Mistral-format files runs in Hugging Face format, as the rig's own prompts do."""
    if model.path == EMBEDDED:
        return
    root = Path(model.path).expanduser()
    found = sorted({f.name for pattern in MISTRAL_FILES for f in root.glob(pattern)})
    if not found:
        return
    wrong = {k: v for k, v in HF_FORMAT.items() if model.engine_args.get(k) != v}
    if wrong:
        key = next(iter(wrong))
        pinned = ", ".join(f"{k}: {v}" for k, v in HF_FORMAT.items())
        raise ConfigError(
            f"{role}.model.engine_args.{key}",
            f"model {model.name!r}: {model.path} holds Mistral-format files ({', '.join(found[:3])}), "
            f"which vLLM would load in its own format while the rig renders prompts with the Hugging "
            f"Face tokenizer there; set engine_args {{{pinned}}} (conf/model/mistral_small_24b_instruct"
            ".yaml does)",
        )


def check_engine_args(bindings: Bindings, roles: tuple[str, ...] = ROLES) -> None:
    """Every in-process role's `engine_args` key is one vLLM takes (checked before the plan reads them)."""
    for role in bindings.in_process(roles):
        _check_engine_args(role, bindings[role].model)


def _check_engine_args(role: str, model: ModelSettings) -> None:
    if not model.engine_args:
        return
    try:
        # vllm (heavy, optional) is imported only when there are engine arguments to check.
        from ..engines.vllm_args import engine_args_problem

        problem = engine_args_problem(model)
    except ImportError as exc:
        raise ConfigError(
            f"{role}.model.engine_args",
            f"cannot check them: vllm is not importable ({exc}); install the cpu or gpu extra",
        ) from None
    if problem is not None:
        raise ConfigError(f"{role}.model.engine_args.{problem[0]}", f"model {model.name!r}: {problem[1]}")


def _check_thinking(role: str, model: ModelSettings) -> None:
    """A thinking model names a reasoning parser vLLM has (it separates the thought from the answer)."""
    if not model.thinking and model.reasoning_parser is None:
        return
    from ..engines.vllm_args import thinking_problem

    problem = thinking_problem(model)
    if problem is not None:
        raise ConfigError(f"{role}.model.{problem[0]}", f"model {model.name!r}: {problem[1]}")


def _check_grammars(role: str, backend: str, bounds: Bounds) -> None:
    """Every schema this role's stages use compiles for its model's structured-output backend."""
    asked = {role, "builder"} if role == "auditor" else {role}
    for stage in (s.name for s in STAGES.values() if s.role in asked and s.json):
        why = stage_unsupported(stage, backend, bounds)
        if why:
            raise ConfigError(
                f"{role}.model.structured_outputs_backend", f"{backend} cannot take the {stage} schema: {why}"
            )


@functools.cache
def stage_unsupported(stage: str, backend: str, bounds: Bounds) -> str | None:
    """`unsupported` for a stage's schema on a sample state (the features matter, not the ids);
    cached, since every point of a sweep checks the same combinations before anything starts."""
    ids = AuditIds(fact_ids=("f_0", "f_1"), commitment_ids=("c_0", "c_1"), retrievable=(0,), new_fact_ids=("f_2",))
    schema = schema_for(stage, ids, bounds, id_form(backend))
    return unsupported(schema, backend) if schema is not None else None  # a plain-text stage has no grammar
