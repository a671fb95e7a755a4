"""A fragment's outer sync between its send and its landing (hetauto.runtime.island_sync, Streaming DiLoCo's
overlap tau): what each rank holds while the exchange is in flight, and where a holder's seconds went.

Why its own module: one job, the state of one exchange in flight and its timings, apart from the sync's set-up
and its hook; the checkpoint (hetauto.runtime.checkpoint_outer) reads it too, to save a settled fragment's merged
pseudo-gradient and the step it lands after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from hetauto.runtime.island_exchange import PendingExchange

__all__ = ["InFlight", "InFlightPart"]


@dataclass
class InFlightPart:
    """One bucket of a fragment in flight: its names, and on a holder its exchange and the tensors' shapes."""

    names: list[str]
    exchange: PendingExchange | None  # None on a non-holder, and once settled (its payloads freed)
    likes: tuple[torch.Tensor, ...]  # meta tensors shaped like the full pseudo-gradients (holders)
    settled: bool = False
    key: str = ""  # the holder group it goes through (holders)
    mine: torch.Tensor | None = None  # this holder's packed payload, kept to resend it to a new membership
    members: tuple[int, ...] = ()  # the islands (plan order) of the exchange posted, in its payloads' order


@dataclass
class InFlight:
    """A fragment's sync between its send (pseudo-gradients taken, exchange posted) and its landing (the outer
    step, after `land_step`). Seconds: what this rank spent sending and settling (waits excluded), how long it
    waited, when the exchange finished (perf_counter)."""

    fragment: int
    land_step: int
    parts: list[InFlightPart]
    sent_bytes: int
    send_s: float
    send_end: float
    merged: dict[str, torch.Tensor] | None = None  # this rank's slices of the merged pseudo-gradients, once settled
    wait_s: float = 0.0
    settle_s: float = 0.0
    finished: float = 0.0
    posted: float | None = None  # the first exchange's post (perf_counter; holders)
    slices: dict[str, torch.Tensor] = field(default_factory=dict)  # the settled buckets' slices so far
    dropped: list[int] = field(default_factory=list)  # islands dropped from the sync while this fragment synced
    lost_at: float | None = None  # when this holder first found a member lost (perf_counter)

    def phases(self, step_s: float) -> dict[str, float]:
        """Where a holder's sync went (seconds): `send_s` pseudo-gradients, TP gathers, encode, post; `exchange_s`
        from the first post until the last exchange finished (waiting for a later island included); `wait_s` of
        it the rank stood waiting; `merge_s` decode, merge, stage broadcast; `step_s` the outer step;
        `posted_at` the first post's wall clock (time.time(): the islands of one host compare theirs, so a
        peer's lateness can be told from the wire's time)."""
        posted = self.posted if self.posted is not None else self.send_end
        return {"send_s": self.send_s, "exchange_s": max(0.0, self.finished - posted), "wait_s": self.wait_s,
                "merge_s": self.settle_s, "step_s": step_s,
                "posted_at": time.time() - (time.perf_counter() - posted)}
