"""`--memory-headroom F`, shared by `hetauto plan` (the planning input, written into the plan) and `hetauto
simulate / evaluate / run` (a saved plan is checked at its own `memory_headroom`; the flag checks it at F
instead). See hetauto.core.headroom."""

from __future__ import annotations

import argparse

from hetauto.core.headroom import DEFAULT_MEMORY_HEADROOM, FLAG, check_headroom
from hetauto.core.plan import Plan
from hetauto.job.prepare import require_fit  # noqa: F401 (simulate's check; the run service's too)


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
