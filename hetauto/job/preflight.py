"""Before `hetauto run` starts a process: does this host have the backends and devices the plan needs?

Why: a plan names its stages' backends through its clusters (hetauto.core.stage_backends). Learning inside
torchrun, after every rank has imported torch, that stage 2's Ascend devices are not here, or starting 256
worker processes on a 2-core box because a 256-device plan was run locally, is the worst way to find out.
Every problem is one line naming the stage, cluster, backend, the probe's reason and the fix.

A local run puts every rank on this host. Without `--emulate` each rank needs a device of its stage's
backend here (`Backend.device_count()`; the `cpu` backend's one device is the host, which up to
`MAX_LOCAL_RANKS` ranks share). With `--emulate` the clusters are emulated on the CPU: a stage whose backend
cannot run here runs on `mock` (its tensors in host memory, behind the same contract), at most
`MAX_LOCAL_RANKS` ranks in all (each rank is a process holding torch: ~0.3-0.5 GiB of host memory).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from hetauto.core.cluster import ClusterSpec
from hetauto.core.errors import HetautoError, UnknownBackend
from hetauto.core.plan import Plan
from hetauto.core.stage_backends import FORCE_ENV, stage_backend_names

__all__ = ["MAX_LOCAL_RANKS", "EMULATION_BACKEND", "Preflight", "check_backends"]

MAX_LOCAL_RANKS = 32
EMULATION_BACKEND = "mock"
MULTI_NODE = "start it on its own hosts, one torchrun per node (hetauto run PLAN --print-launch --master HOST)"


@dataclass(frozen=True, slots=True)
class Preflight:
    """The backend each stage runs on here, and the stages `--emulate` moved onto `mock` (stage, was)."""

    backends: tuple[str, ...]
    emulated: tuple[tuple[int, str], ...] = ()
    mock_devices: int | None = None  # HETAUTO_MOCK_DEVICES the workers need (None: the default suffices)


def _where(plan: Plan, i: int) -> str:
    return f"stage {i} (cluster '{plan.stages[i].cluster}')"


def check_backends(plan: Plan, cluster: ClusterSpec, *, emulate: bool) -> Preflight:
    """Each stage's backend as it will run on this host, or a HetautoError naming what is missing."""
    from hetauto.backends import get_registry
    from hetauto.runtime.devices import shares_host

    if emulate and plan.world_size > MAX_LOCAL_RANKS:
        raise HetautoError(f"the plan has {plan.world_size} ranks; --emulate runs every rank as a process on this "
                           f"host, at most {MAX_LOCAL_RANKS}; {MULTI_NODE}, or plan a smaller cluster")
    registry = get_registry()
    names = list(stage_backend_names(plan, cluster))
    forced = bool((os.environ.get(FORCE_ENV) or "").strip())
    moved: list[tuple[int, str]] = []
    for i, name in enumerate(names):
        try:
            backend = registry.get(name)
        except UnknownBackend:
            if emulate and not forced:
                moved.append((i, name))
                names[i] = EMULATION_BACKEND
                continue
            raise HetautoError(f"{_where(plan, i)}: backend '{name}' is not registered here (registered: "
                               f"{', '.join(registry.names())}); install the plugin that provides it") from None
        avail = backend.probe()
        if avail.ok:
            continue
        if emulate and not forced:
            moved.append((i, name))
            names[i] = EMULATION_BACKEND
            continue
        hint = f"; install: {backend.install_hint}" if backend.install_hint else ""
        raise HetautoError(f"{_where(plan, i)}: backend '{name}' is not available on this host: {avail.reason}{hint}; "
                           f"or {MULTI_NODE}, or try it here on the CPU with --emulate")
    ranks = Counter()
    for i, s in enumerate(plan.stages):
        ranks[names[i]] += s.num_devices
    mock_devices = None
    for name, need in ranks.items():
        backend = registry.get(name)
        if name == EMULATION_BACKEND and emulate:
            have = backend.device_count()
            if need > have:
                mock_devices = need  # emulated devices: give the workers as many as the plan needs
            continue
        if shares_host(backend):
            if need > MAX_LOCAL_RANKS:
                raise HetautoError(f"the plan runs {need} ranks on backend '{name}' (the host CPU); this host runs at "
                                   f"most {MAX_LOCAL_RANKS}; {MULTI_NODE}")
            continue
        have = backend.device_count()
        if need > have:
            users = [str(i) for i, n in enumerate(names) if n == name]
            raise HetautoError(f"the plan runs {need} ranks on backend '{name}' (stage(s) {', '.join(users)}) but this "
                               f"host has {have} {name} device(s); {MULTI_NODE}, or try it here on the CPU with "
                               f"--emulate (at most {MAX_LOCAL_RANKS} ranks)")
    return Preflight(tuple(names), tuple(moved), mock_devices)
