"""Memory headroom: the share of each device's memory a plan keeps free.

Why: the cost model counts weights, gradients, optimizer states, activations and a workspace margin, but not
the caching allocator's fragmentation, NCCL/HCCL buffers or a library's extra workspace; a plan that fills 99%
of a device on paper runs out of memory in practice. Every planner fits a stage into `usable_bytes(memory,
headroom)`, and every check of a saved plan uses the plan's own `memory_headroom` (`hetauto plan
--memory-headroom F` sets it; `hetauto simulate / evaluate / run --memory-headroom F` check a saved plan at F
instead).
"""

from __future__ import annotations

from hetauto.core.errors import HetautoError
from hetauto.core.plan import DEFAULT_MEMORY_HEADROOM
from hetauto.core.units import format_bytes

__all__ = ["DEFAULT_MEMORY_HEADROOM", "FLAG", "check_headroom", "memory_violation", "usable_bytes"]

FLAG = "--memory-headroom"
_GiB = float(1 << 30)


def _gib(x: float) -> str:
    return f"{x / _GiB:.1f} GiB" if x >= 0.1 * _GiB else format_bytes(x)


def check_headroom(value: float, flag: str = FLAG) -> float:
    """`value` when it is a share in [0, 1), else a one-line HetautoError naming `flag`."""
    if not 0.0 <= value < 1.0:  # also refuses NaN
        raise HetautoError(f"{flag} {value:g}: give the share of each device's memory to keep free, from 0 "
                           f"(none) to below 1 (default {DEFAULT_MEMORY_HEADROOM:g})")
    return float(value)


def usable_bytes(memory_bytes: float, headroom: float) -> float:
    """What a stage may use of a device with `memory_bytes`, `headroom` of it kept free."""
    return memory_bytes * (1.0 - headroom)


def memory_violation(stage: int, cluster: str, devices: int, device: str, layers: tuple[int, int], need: float,
                     memory_bytes: float, headroom: float, *, who: str | None = None) -> str:
    """The one-line reason a stage does not fit: stage, device, GiB needed, GiB available after the headroom,
    and the flag that sets the headroom. `who` replaces "{devices}x {device}" (a mixed DP group names its
    tightest replica kind)."""
    have = usable_bytes(memory_bytes, headroom)
    kept = (f" ({FLAG} {headroom:g} keeps {_gib(memory_bytes - have)} of {_gib(memory_bytes)} free)" if headroom
            else f" (all of it: {FLAG} 0)")
    who = f"{devices}x {device}" if who is None else who
    return (f"stage {stage} (cluster {cluster}, {who}, layers [{layers[0]}, {layers[1]})): needs "
            f"{_gib(need)} per device > {_gib(have)} available{kept}")
