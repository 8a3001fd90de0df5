"""`mode=plan`: will this config fit its GPUs and its context windows, before anything loads?

The exit code is the verdict: 0 go; 1 it would start, but some call outgrows
its window before `max_turns`; 2 it cannot start as configured.
"""

from __future__ import annotations

import sys

from ..config import RunConfig
from ..execution.preflight import plan_growth
from ..execution.projection import measured
from ..exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from ..plan import CANNOT, GO, OVERFLOW, Plan, check, project, render, verdict

EXITS = {GO: EXIT_OK, OVERFLOW: EXIT_FAILED, CANNOT: EXIT_BAD_INPUT}


def full(cfg: RunConfig) -> Plan:
    """The whole plan: the checks, then the prompt projection from the rig's own templates."""
    plan = check(cfg)
    if not plan.engines and not plan.remote:
        return plan  # engine=scripted: no model, no window, nothing to project
    if cfg.plan.measured:
        growth = measured(cfg.plan.measured)
    else:
        # The plan reports what does not fit instead of refusing it: only the episode inputs are checked.
        growth = plan_growth(cfg)
    project(plan, growth)
    return plan


def main(cfg: RunConfig) -> int:
    """`mode=plan`: print the plan; the exit code is the verdict (see the module doc)."""
    plan = full(cfg)
    for line in render(plan):
        print(line)
    how, text = verdict(plan)
    print(text, flush=True)
    if how == CANNOT:
        p = plan.fatal[0]
        print(f"error: config: {p.field}: plan: {p.message}", file=sys.stderr)
    return EXITS[how]
