"""The batched launcher: Hydra composes the sweep's points, ncp_local.launch.sweep runs them together.

Hydra imports every module under `hydra_plugins` when it starts (even for a
single run), so this one imports nothing of the rig until it launches but
the exit codes (a module of constants).

Each point's config is composed exactly as Hydra's basic launcher composes
it (`load_sweep_config`), so a point has the config, identity and run
directory it would have alone. Instead of calling the task function once
per point, the launcher hands all points to `ncp_local.launch.sweep.run_sweep`,
which checks them all, runs the valid ones in one process on shared
engines, writes the sweep index and prints the summary. A sweep with a
failed or stopped point exits with its code here (Hydra has no way to
return one from a launcher).
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ncp_local.exits import EXIT_BAD_INPUT

log = logging.getLogger(__name__)


class BatchedLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        super().__init__()
        self.params = params
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def _task_config(self, overrides: Sequence[str], num: int) -> DictConfig:
        """The point's config as the task function would get it (no `hydra` node)."""
        assert self.hydra_context is not None and self.config is not None
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = num
            sweep_config.hydra.job.num = num
        # `${hydra:...}` interpolations in the task config resolve against the point's own hydra node.
        HydraConfig.instance().set_config(sweep_config)
        task = copy.deepcopy(sweep_config)
        with read_write(task), open_dict(task):
            del task["hydra"]
        return task

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from ncp_local.execution.life import Point
        from ncp_local.launch import sweep

        setup_globals()
        assert self.config is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        points: list[Point] = []
        for i, overrides in enumerate(job_overrides):
            num = initial_job_idx + i
            shown = tuple(filter_overrides(overrides))
            p = Point(num, shown)
            try:
                p.task = self._task_config(overrides, num)
                # Resolved now, while the point's own hydra node is the current one (`${hydra:job.num}`).
                p.raw = OmegaConf.to_container(p.task, resolve=True)  # type: ignore[assignment]
            except Exception as exc:  # composition or interpolation: this point's failure, not the sweep's
                p.raw = p.raw or {}
                p.fail(EXIT_BAD_INPUT, f"config: {exc}".splitlines()[0])
            points.append(p)
        code = sweep.run_sweep(points, sweep_dir)
        returns = []
        for p in points:
            ret = JobReturn(
                overrides=list(p.overrides),
                cfg=p.task if p.task is not None else OmegaConf.create({}),
                hydra_cfg=self.config,
                working_dir=str(Path.cwd()),
                task_name="run",
            )
            ret.status = JobStatus.COMPLETED
            ret.return_value = p.code
            returns.append(ret)
        if code:
            sys.exit(code)
        return returns
