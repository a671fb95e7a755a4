"""Which backend each plan stage runs on, and which kind of transport each stage boundary needs.

Why in core, without torch: the launcher checks a plan's backends before anything starts, the worker
selects its stage's backend, and the cost model prices each boundary's transport; all three must read the
same answer from the same plan and cluster spec.

A stage runs on its cluster's backend: the cluster's own `backend:` key, else its device profile's
`backend:`. `HETAUTO_BACKEND=name` forces one backend for every stage of a run.
"""

from __future__ import annotations

import os
from typing import Mapping

from hetauto.core.cluster import ClusterSpec
from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan

__all__ = ["DEFAULT_BACKEND", "FORCE_ENV", "stage_backend_names", "builtin_transport_kind", "boundary_pairs"]

FORCE_ENV = "HETAUTO_BACKEND"
DEFAULT_BACKEND = "cpu"  # what a caller that names no backends (tests, benchmarks) trains on: the host


def stage_backend_names(plan: Plan, cluster: ClusterSpec, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The backend name of every stage, in stage order ($HETAUTO_BACKEND, when set, for all of them)."""
    env = os.environ if environ is None else environ
    forced = (env.get(FORCE_ENV) or "").strip()
    if forced:
        return (forced,) * plan.num_stages
    out = []
    for i, s in enumerate(plan.stages):
        if s.cluster not in cluster.names:
            raise PlanMismatch(f"stage {i}: unknown cluster '{s.cluster}'; the cluster spec has: {', '.join(cluster.names)}")
        out.append(cluster.cluster(s.cluster).backend)
    return tuple(out)


def builtin_transport_kind(src_backend: str, dst_backend: str) -> str:
    """The built-in transport a boundary gets: `device` between two stages of the same backend (its own
    collective library end to end, e.g. nccl between two CUDA clusters), else `host` (device -> host -> gloo
    -> device). Why the backend and not the dist-backend name: ROCm's RCCL also calls itself "nccl" but
    cannot talk to NVIDIA's NCCL, and cpu and mock both say "gloo" but are different backends."""
    return "device" if src_backend == dst_backend else "host"


def boundary_pairs(plan: Plan) -> tuple[tuple[int, int], ...]:
    """(source stage, destination stage) of every forward boundary the executor sends over, in a fixed order:
    h -> h+1, and for interleaved plans the wrap from the last stage back to the first."""
    p = plan.num_stages
    pairs = [(h, h + 1) for h in range(p - 1)]
    if plan.schedule.name == "interleaved" and p > 1:
        pairs.append((p - 1, 0))
    return tuple(pairs)
