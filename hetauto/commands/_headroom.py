"""`--memory-headroom F`, shared by `hetauto plan` (the planning input, written into the plan) and `hetauto
simulate / evaluate / run` (a saved plan is checked at its own `memory_headroom`; the flag checks it at F
instead). See hetauto.core.headroom."""

from __future__ import annotations

import argparse
from typing import Any

from hetauto.core.errors import HetautoError, InfeasiblePlan
from hetauto.core.headroom import DEFAULT_MEMORY_HEADROOM, FLAG, check_headroom
from hetauto.core.plan import Plan


def add_planning_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(FLAG, type=float, default=None, metavar="F",
                        help=f"share of each device's memory every planner keeps free for the allocator's "
                             f"fragmentation and workspaces, written into the plan (default {DEFAULT_MEMORY_HEADROOM:g})")


def add_check_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(FLAG, type=float, default=None, metavar="F",
                        help="check the plan's memory with this share of each device kept free instead of the "
                             f"plan's own memory_headroom (a plan without one: {DEFAULT_MEMORY_HEADROOM:g})")


def requested(args: argparse.Namespace) -> float | None:
    """The flag's value, checked (None when not given)."""
    value = getattr(args, "memory_headroom", None)
    return None if value is None else check_headroom(value)


def with_headroom(plan: Plan, args: argparse.Namespace) -> Plan:
    """`plan` checked at the flag's headroom when given, else as it is."""
    value = requested(args)
    return plan if value is None else plan.model_copy(update={"memory_headroom": value})


def require_fit(plan: Plan, inputs: Any = None) -> None:
    """An `InfeasiblePlan` (one line: stage, device, GiB needed, GiB available, the flag) when a stage of `plan`
    does not fit its device less the plan's headroom; a plan the cost model cannot price is left to the caller's
    own report of that."""
    from hetauto.planner.evaluate import Evaluator, inputs_for_plan

    try:
        ev = Evaluator(inputs if inputs is not None else inputs_for_plan(plan)).evaluate(plan)
    except InfeasiblePlan:
        raise
    except HetautoError:
        return
    if not ev.feasible:
        raise InfeasiblePlan(f"plan does not fit: {ev.violation}; re-plan (hetauto plan), or check it at another "
                             f"share with {FLAG} F")
