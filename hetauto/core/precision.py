"""Precision of a plan: what `training.precision` resolves to and what it costs in bytes.

Why one module: the executor runs the precision and the cost model prices it; both must agree on what
"auto" means and on the byte sizes, so neither decides it alone. No torch here (the planner reads it).

Mixed precision (bf16, fp16) is the standard AMP recipe: fp32 master weights, fp32 gradients and AdamW
states, the forward and backward compute in the 16-bit dtype (torch.autocast), and stage-boundary
activations and their gradients sent in the 16-bit dtype. fp32 is plain fp32 throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = ["DTYPE_BYTES", "DeviceKind", "HOST_BACKENDS", "backend_kind", "resolve_precision", "compute_bytes",
           "PRECISION_TOLERANCE"]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# How close a run's per-step loss must be to its single-process reference of the same precision (absolute,
# on the ~5.5 (log vocab) losses of the reference models, over a few steps): fp32 is the same arithmetic up to
# summation order (measured <= 7e-7); a 16-bit run also rounds each stage's boundary tensors (and the DP sum
# when grad_reduce_dtype is 16-bit), which the one-process reference does not, and a GPU's 16-bit kernels sum
# in other orders than the CPU's. Measured on tiny-gpt, CPU: bf16 7e-5, fp16 3e-5 from their references; the
# bounds leave room for ~1e-3 relative (bf16: 8 mantissa bits) and ~4x less for fp16 (11 bits).
PRECISION_TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}


@dataclass(frozen=True, slots=True)
class DeviceKind:
    """What precision resolution needs to know of one stage's device."""

    host: bool  # computes on the host CPU (the cpu and mock backends)
    bf16: bool = True
    fp16: bool = True


# Built-in backends whose tensors live in host memory (device type "cpu"): they compute on the CPU and a host
# transport copies nothing for them. The executor asks the device itself; a plan made elsewhere has only names.
HOST_BACKENDS = ("cpu", "mock")


def backend_kind(backend: str) -> DeviceKind:
    """What a plan can know of a stage from its backend's name alone: host for cpu and mock; any other backend
    is assumed to have bf16 and fp16 (the running ranks check their real devices: hetauto.runtime.training)."""
    return DeviceKind(host=backend in HOST_BACKENDS)


def resolve_precision(requested: str, kinds: Iterable[DeviceKind]) -> str:
    """"auto" -> fp32 when any stage computes on the host CPU (CPU bf16 is slower than fp32 and the CPU runs
    are how we test, bit for bit), else bf16 when every device has it, else fp16 when every device has it,
    else fp32. An explicit precision is returned as is once every device supports it; otherwise ValueError
    says which precision to use instead."""
    kinds = list(kinds)
    if requested == "auto":
        if not kinds or any(k.host for k in kinds):
            return "fp32"
        if all(k.bf16 for k in kinds):
            return "bf16"
        if all(k.fp16 for k in kinds):
            return "fp16"
        return "fp32"
    if requested not in DTYPE_BYTES:
        raise ValueError(f"unknown precision {requested!r}; use one of auto, {', '.join(DTYPE_BYTES)}")
    if requested == "bf16" and not all(k.bf16 for k in kinds):
        raise ValueError("precision bf16: a stage's device has no bf16; use fp16 or fp32")
    if requested == "fp16" and not all(k.fp16 for k in kinds):
        raise ValueError("precision fp16: a stage's device has no fp16; use fp32")
    return requested


def compute_bytes(precision: str) -> int:
    """Bytes per element of activations and boundary tensors at a resolved precision."""
    try:
        return DTYPE_BYTES[precision]
    except KeyError:
        raise ValueError(f"precision {precision!r} is not resolved; use one of {', '.join(DTYPE_BYTES)}") from None
