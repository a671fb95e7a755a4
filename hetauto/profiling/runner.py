"""`run_profile`: measure the selected backend's device and turn the figures into a `DeviceProfile`.

Order of work: collectives first (when several ranks run, they need everyone), then the single-device
sweeps (GEMM, memory bandwidth), then the per-block samples (TP samples are collective again). All
device work goes through the `Backend` (device, synchronize, timer, memory_stats), so the same code
profiles a CPU here and an accelerator elsewhere.

How the profile is assembled: the measured document is merged over the catalog entry the backend names
as its `default_profile` (or the `cpu` entry for fields nobody measured, when it names none). Peak FLOP/s
stays the published figure when the catalog has a trusted one and the measurement stays below it; the
efficiency model's `max_eff`/`half_size_flops` are fitted to the GEMM sweep, so `peak * eff(size)`
reproduces the measured throughput curve. For an `estimated` catalog entry (or a device without one) the
fitted asymptote becomes the peak.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from hetauto.core.backend import Backend
from hetauto.core.profile import (
    CollectiveFits,
    DeviceProfile,
    EfficiencyDoc,
    GemmSample,
    LayerSample,
    MeasuredDoc,
    ProfileDoc,
    catalog,
)
from hetauto.profiling.fitting import fit_saturation
from hetauto.profiling.gemm import Shape, default_shapes, sweep_gemm
from hetauto.profiling.layers import LayerPoint, default_grid, sample_layers
from hetauto.profiling.membw import MemoryBandwidth, measure_memory_bandwidth

__all__ = ["ProfileOptions", "ProfileRun", "GemmFit", "run_profile", "build_profile", "efficiency_from_gemm", "world_from_env"]

_BACKEND_NAMES = ("cuda", "rocm", "npu", "xpu", "cpu", "mock")  # ProfileDoc.backend's allowed values


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """What to measure. `None` sizes mean the defaults for `quick` (a ~10 s CPU run) or the full sweep."""

    quick: bool = False
    dtypes: tuple[str, ...] | None = None
    samples: bool = False
    gemm: bool = True
    memory_bandwidth: bool = True
    collectives: bool = True
    gemm_shapes: tuple[Shape, ...] | None = None
    message_sizes: tuple[int, ...] | None = None
    layer_grid: tuple[LayerPoint, ...] | None = None
    membw_bytes: int | None = None
    max_gemm_s: float | None = None
    repeats: int = 3
    timeout_s: float = 120.0
    progress: bool = True

    def resolved_dtypes(self) -> tuple[str, ...]:
        if self.dtypes:
            return self.dtypes
        return ("bfloat16", "float32") if self.quick else ("bfloat16", "float16", "float32")


@dataclass(frozen=True, slots=True)
class GemmFit:
    """Peak and efficiency model fitted to the GEMM sweep of one dtype."""

    peak_flops: float
    efficiency: EfficiencyDoc
    dtype: str


@dataclass(frozen=True, slots=True)
class ProfileRun:
    """The profile plus what the table shows and the profile document has no field for."""

    profile: DeviceProfile
    base: str | None
    backend: str
    device_name: str
    rank: int
    world_size: int
    memory_bandwidth: MemoryBandwidth | None
    elapsed_s: float
    gemm_fit: GemmFit | None = None
    notes: tuple[str, ...] = field(default=())


def world_from_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the torchrun environment; (0, 1, 0) when absent."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        rank = int(os.environ.get("RANK", "0") or 0)
        local = int(os.environ.get("LOCAL_RANK", str(rank)) or rank)
    except ValueError:
        return 0, 1, 0
    return rank, max(world, 1), local


def efficiency_from_gemm(
    samples: list[GemmSample] | tuple[GemmSample, ...], base: DeviceProfile | None, dtype: str | None = None
) -> GemmFit | None:
    """(peak_flops, efficiency) fitted to the GEMM samples of `dtype`; None without samples.

    Default dtype: the fastest measured one, i.e. the dtype the device would train in (bf16/fp16 on an
    accelerator; often fp32 on a CPU without native bf16). See the module docstring for the peak rule."""
    if not samples:
        return None
    fastest: dict[str, float] = {}
    for s in samples:
        fastest[s.dtype] = max(fastest.get(s.dtype, 0.0), s.achieved_flops)
    pick = dtype or max(fastest, key=lambda d: fastest[d])
    rows = [s for s in samples if s.dtype == pick] or list(samples)
    top, half = fit_saturation([(s.flops, s.achieved_flops) for s in rows])
    best = max(s.achieved_flops for s in rows)
    if base is None or base.estimated or top > base.peak_flops:
        peak = max(top, best)
    else:
        peak = base.peak_flops
    tp_penalty = base.efficiency_model.tp_penalty if base is not None else 1.0
    max_eff = min(max(top / peak, 1e-6), 1.0)
    return GemmFit(peak, EfficiencyDoc(max_eff=max_eff, half_size_flops=half, tp_penalty=tp_penalty), pick)


def build_profile(
    backend: Backend,
    base: DeviceProfile | None,
    *,
    device_name: str,
    gemm: list[GemmSample],
    memory_bandwidth: MemoryBandwidth | None,
    collectives: CollectiveFits | None,
    samples: list[LayerSample],
    memory_total: int = 0,
) -> DeviceProfile:
    """Merge the measurements over `base` (or the catalog's `cpu` entry when the backend names none)."""
    fallback = base if base is not None else catalog()["cpu"]
    fitted = efficiency_from_gemm(gemm, base)
    host = platform.node() or None
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    measured = MeasuredDoc(
        backend_version=f"torch {torch.__version__}",
        host=host,
        gemm=tuple(gemm),
        memory_bandwidth=memory_bandwidth.best_Bps if memory_bandwidth else None,
        collectives=collectives or CollectiveFits(),
        samples=tuple(samples),
    )
    gemm_what = f"GEMM peak/efficiency ({fitted.dtype})" if fitted else ""
    what = [w for w, ok in ((gemm_what, fitted), ("memory bandwidth", memory_bandwidth), ("memory size", memory_total > 0))
            if ok]
    doc: dict[str, Any] = {
        "schema": "hetauto.profile/1",
        "key": fallback.key if base is not None else f"{backend.name}-measured",
        "name": f"{device_name} (measured)",
        "source": (f"measured by `hetauto profile` on {host or 'this host'} at {when} ({backend.name} backend, "
                   f"torch {torch.__version__}): {', '.join(what) or 'nothing'}; other fields from catalog "
                   f"'{fallback.key}'"),
        "measured": measured,
    }
    if backend.name in _BACKEND_NAMES:
        doc["backend"] = backend.name
    if fitted is not None:
        doc["peak_flops"], doc["efficiency"] = fitted.peak_flops, fitted.efficiency
    if memory_bandwidth is not None:
        doc["memory_bandwidth"] = memory_bandwidth.best_Bps
    if memory_total > 0:
        doc["memory_bytes"] = float(memory_total)
    return fallback.merge(ProfileDoc.model_validate(doc))


class _Steps:
    """A rich progress bar on stderr (rank 0 only), advanced once per measured step."""

    def __init__(self, enabled: bool, total: int) -> None:
        self._progress: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[bold]profile[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                      TimeElapsedColumn(), TextColumn("{task.description}"),
                                      console=Console(stderr=True), transient=True)
            self._task = self._progress.add_task("", total=total)
            self._progress.start()

    def step(self, label: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=label)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def run_profile(backend: Backend, options: ProfileOptions = ProfileOptions(), *, comm: Any = None) -> ProfileRun:
    """Measure `backend`'s device (the one LOCAL_RANK selects). Under torchrun (WORLD_SIZE > 1) every rank
    must call this; the collective fits and TP samples need all of them. Every rank gets its own profile;
    rank 0's carries the point-to-point fit and is the one to write."""
    t0 = time.perf_counter()
    rank, world, local = world_from_env()
    count = backend.device_count()
    index = local % count if count > 0 else 0
    backend.set_device(index)
    device = backend.device(index)
    device_name = backend.capabilities(index).device_name or backend.name
    base_key = backend.default_profile()
    base = catalog().get(base_key) if base_key else None
    dtypes = options.resolved_dtypes()
    shapes = list(options.gemm_shapes or default_shapes(options.quick))
    sizes = list(options.message_sizes or [])
    grid = list(options.layer_grid or default_grid(options.quick, world)) if options.samples else []
    notes: list[str] = []

    comm, own_comm = _communicator(backend, options, comm, world)
    if comm is not None:
        rank, world = comm.rank, comm.world_size
    if comm is not None and options.collectives and not sizes:
        from hetauto.profiling.collectives import default_sizes

        sizes = default_sizes(options.quick)
    do_coll = comm is not None and options.collectives and world > 1
    total = (len(dtypes) * len(shapes) if options.gemm else 0) + int(options.memory_bandwidth) \
        + (3 * len(sizes) if do_coll else 0) + len(grid)
    steps = _Steps(options.progress and rank == 0, total)
    fits: CollectiveFits | None = None
    gemm: list[GemmSample] = []
    membw: MemoryBandwidth | None = None
    samples: list[LayerSample] = []
    try:
        if do_coll:
            from hetauto.profiling.collectives import measure_collectives

            fits = measure_collectives(comm, backend, device, sizes, repeats=options.repeats, on_step=steps.step)
        stats = backend.memory_stats(index)
        if options.gemm:
            max_s = options.max_gemm_s if options.max_gemm_s is not None else (0.02 if options.quick else 0.25)
            gemm, gemm_notes = sweep_gemm(backend, device, dtypes, shapes, max_gemm_s=max_s,
                                          free_bytes=stats.free or None, repeats=options.repeats, on_step=steps.step)
            notes.extend(gemm_notes)
        if options.memory_bandwidth:
            want = options.membw_bytes or (64 * 2**20 if options.quick else 512 * 2**20)
            if stats.free:
                want = min(want, stats.free // 8)
            membw = measure_memory_bandwidth(backend, device, want, repeats=max(options.repeats, 3))
            steps.step("memory bandwidth")
        if grid:
            samples = _layer_samples(backend, device, options, grid, gemm, base, dtypes, comm, (rank, world),
                                     steps)
            if world == 1:
                notes.append("layer samples: tp=1 only (one rank; launch with torchrun for tp > 1)")
    finally:
        steps.close()
        if own_comm:
            comm.destroy()
    memory_total = backend.memory_stats(index).total
    profile = build_profile(backend, base, device_name=device_name, gemm=gemm, memory_bandwidth=membw,
                            collectives=fits, samples=samples, memory_total=memory_total)
    profile = _at_speed(profile, backend.speed_factor(index), notes)
    if base is None:
        notes.append(f"backend '{backend.name}' names no catalog device; unmeasured fields come from catalog 'cpu'")
    return ProfileRun(profile=profile, base=base_key if base else None, backend=backend.name, device_name=device_name,
                      rank=rank, world_size=world, memory_bandwidth=membw, elapsed_s=time.perf_counter() - t0,
                      gemm_fit=efficiency_from_gemm(gemm, base), notes=tuple(notes))


def _communicator(backend: Backend, options: ProfileOptions, comm: Any, world: int) -> tuple[Any, bool]:
    """(the communicator the collective fits and TP samples run on, whether this run created it and must
    destroy it): the caller's, the already-initialised process group's, or one from the torchrun environment;
    None where one rank measures alone or nothing needs one."""
    if comm is None and world > 1 and (options.collectives or options.samples):
        import torch.distributed as dist

        from hetauto.core.comm import Communicator

        if dist.is_initialized():
            return Communicator.from_current(timeout_s=options.timeout_s), False
        return Communicator.init_from_env(backend, timeout_s=options.timeout_s), True
    return comm, False


def _layer_samples(backend: Backend, device: Any, options: ProfileOptions, grid: list[Any], gemm: list[GemmSample],
                   base: Any, dtypes: list[str], comm: Any, where: tuple[int, int], steps: _Steps) -> list[LayerSample]:
    """Blocks timed over `grid` in the dtype the device is fastest in (the one the GEMM fit chose), skipping the
    points the measured GEMM rate says would take too long; every rank runs the same points in the same dtype
    (rank 0's choice, broadcast)."""
    rank, world = where
    fit = efficiency_from_gemm(gemm, base)
    layer_dtype = fit.dtype if fit is not None else dtypes[0]
    rate = max((s.achieved_flops for s in gemm if s.dtype == layer_dtype), default=None)
    if comm is not None and world > 1:  # every rank must run the same points in the same dtype
        agreed = torch.tensor([rate or 0.0, float(dtypes.index(layer_dtype))], dtype=torch.float64,
                              device=device)
        comm.broadcast(agreed, 0)
        rate, layer_dtype = float(agreed[0].item()) or None, dtypes[int(agreed[1].item())]
    return sample_layers(backend, device, grid, layer_dtype, world_size=world, rank=rank,
                         flops_per_s=rate, max_block_s=0.5 if options.quick else 2.0,
                         repeats=options.repeats, on_step=steps.step)


def _at_speed(profile: Any, factor: float, notes: list[str]) -> Any:
    """An emulated slower/faster device (mock): the planner must see the emulated speed (raw measurements stay
    under `measured`)."""
    if factor != 1.0:
        profile = profile.scaled(factor)
        notes.append(f"peak FLOP/s and memory bandwidth scaled by the device's speed factor {factor:g} "
                     "(raw measurements kept under `measured`)")
    return profile
