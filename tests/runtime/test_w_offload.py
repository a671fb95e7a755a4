"""W-set offload on side streams (hetauto.runtime.w_offload.Offloader) with a recording fake stream backend: the
order of events and waits, the values bit for bit, and the device sets held along real ZB-H1 / Virtual-ZB lists
equal to what the cost model prices (costmodel.OFFLOAD_PEAK_SETS at the end of an F, OFFLOAD_DEVICE_SETS after
an I). One process, no device: the fake streams log, the copies run on the CPU."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pytest
import torch

from hetauto.planner import costmodel as cm
from hetauto.runtime import w_offload
from hetauto.runtime.split_backward import Kept, kept_bytes
from hetauto.schedule import zero_bubble
from hetauto.schedule.actions import ActionType as A


class _Stream:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.recorded = name, log, 0

    def record_event(self) -> str:
        ev = f"{self.name}:{self.recorded}"
        self.recorded += 1
        self.log.append(("record", self.name, ev))
        return ev

    def wait_event(self, ev: str) -> None:
        self.log.append(("wait", self.name, ev))


class _Backend:
    """Streams that log what is queued on them (`current_stream` the compute one; the first side stream made
    the device-to-host one, the second host-to-device), as the backend contract gives them."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self._sides = iter(("d2h", "h2d"))
        self._compute = _Stream("compute", self.log)

    def current_stream(self, device: torch.device) -> _Stream:
        return self._compute

    def side_stream(self, device: torch.device) -> _Stream:
        return _Stream(next(self._sides), self.log)

    @contextmanager
    def use_stream(self, stream: _Stream):  # noqa: ANN201
        self.log.append(("copy on", stream.name))
        yield


def _set(seed: int, rows: int = 4) -> list[Kept]:
    """A W set of two Linears sharing one input (stored once, as the lean W stores it)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 8, generator=g)
    return [Kept(torch.zeros(3, 8), x, torch.randn(rows, 3, generator=g)),
            Kept(torch.zeros(5, 8), x, torch.randn(rows, 5, generator=g))]


def test_copies_wait_on_the_compute_and_w_waits_on_its_copy_in() -> None:
    be = _Backend()
    off = w_offload.Offloader(be, torch.device("cpu"), pin=False)
    sets = {k: _set(k) for k in (0, 1)}
    off.send(0, sets[0])
    assert be.log == [("record", "compute", "compute:0"), ("wait", "d2h", "compute:0"), ("copy on", "d2h"),
                      ("record", "d2h", "d2h:0")]  # out after I's event, its own event recorded after the copy
    be.log.clear()
    off.send(1, sets[1])  # set 0 retired first: the compute stream waits for its copy out, then drops it
    assert be.log[0] == ("wait", "compute", "d2h:0") and be.log[-1] == ("record", "d2h", "d2h:1")
    be.log.clear()
    off.prefetch(0)  # set 1 retired; set 0 comes back after the compute so far and after its own copy out
    assert be.log == [("wait", "compute", "d2h:1"), ("record", "compute", "compute:2"), ("wait", "h2d", "compute:2"),
                      ("wait", "h2d", "d2h:0"), ("copy on", "h2d"), ("record", "h2d", "h2d:0")]
    be.log.clear()
    got = off.take(0)
    assert be.log == [("wait", "compute", "h2d:0")]  # W waits on its copy in, nothing else
    assert got[0].inp is got[1].inp  # the shared input comes back once
    for a, b in zip(got, sets[0]):
        assert torch.equal(a.inp, b.inp) and torch.equal(a.grad_out, b.grad_out) and a.weight is b.weight
        assert a.inp.untyped_storage().data_ptr() != b.inp.untyped_storage().data_ptr()  # a real copy
    assert off.device_sets() == 0


def test_a_set_still_leaving_is_not_copied_back() -> None:
    """Prefetched while its copy out is still in flight (its W two actions after its I): the compute stream waits
    for the copy out and keeps the device set; nothing goes host -> device."""
    be = _Backend()
    off = w_offload.Offloader(be, torch.device("cpu"), pin=False)
    s = _set(3)
    off.send(7, s)
    be.log.clear()
    off.prefetch(7)
    assert be.log == [("wait", "compute", "d2h:0")]
    assert off.take(7) is s


def test_host_backend_copies_in_line() -> None:
    """No side streams (cpu, mock): the same protocol with synchronous copies, bit for bit."""
    from hetauto.backends.cpu import CpuBackend

    off = w_offload.Offloader(CpuBackend(), torch.device("cpu"), pin=False)
    assert not off.overlapped
    s = _set(5)
    off.send(0, s)
    assert off.device_sets() == 0  # copied out at once
    off.prefetch(0)
    got = off.take(0)
    assert all(torch.equal(a.inp, b.inp) and torch.equal(a.grad_out, b.grad_out) for a, b in zip(got, s))


def _walk(actions: tuple, m: int) -> tuple[list[int], list[int], list[str]]:
    """Run one rank's list as the executor drives the offloader (prefetch at `prefetch_points`, send after each
    I, take at each W): the device bytes held at the end of each F, after each I, and the W sets not prefetched
    when their W came."""
    be = _Backend()
    off = w_offload.Offloader(be, torch.device("cpu"), pin=False)
    points = w_offload.prefetch_points(actions, m)
    after_f, after_i, late = [], [], []
    for i, a in enumerate(actions):
        if i in points:
            off.prefetch(points[i])
        key = a.stage * m + (a.microbatch or 0)
        if a.type is A.F:
            after_f.append(off.device_bytes())
        elif a.type is A.I:
            off.send(key, _set(key))
            after_i.append(off.device_bytes())
        elif a.type is A.W:
            if key not in off._arriving:
                late.append(str(a))
            off.take(key)
    off.finish()
    assert off.device_sets() == 0
    return after_f, after_i, late


@pytest.mark.parametrize("p,m,extra", [(4, 8, ()), (4, 8, (1, 1, 0))])
def test_device_sets_along_the_lists_are_what_the_cost_model_prices(p: int, m: int, extra: tuple) -> None:
    """Along every stage's list but the first (its W runs the whole backward, no set): at most
    costmodel.OFFLOAD_PEAK_SETS sets at the end of an F, OFFLOAD_DEVICE_SETS after an I, both reached; every
    W's set is prefetched before the W's turn."""
    one = kept_bytes(_set(0))
    sched = zero_bubble(p, m, extra_warmup=extra) if extra else zero_bubble(p, m)
    for stage in range(1, p):
        after_f, after_i, late = _walk(tuple(sched.ranks[stage]), m)
        assert (max(after_f), max(after_i)) == (cm.OFFLOAD_PEAK_SETS * one, cm.OFFLOAD_DEVICE_SETS * one), stage
        assert late == [], stage


def test_prefetch_points_are_the_compute_action_before_each_w() -> None:
    acts = tuple(zero_bubble(4, 8).ranks[3])
    points = w_offload.prefetch_points(acts, 8)
    compute = [i for i, a in enumerate(acts) if a.type in (A.F, A.I, A.W)]
    for i, key in points.items():
        nxt = acts[compute[compute.index(i) + 1]]
        assert nxt.type is A.W and nxt.stage * 8 + nxt.microbatch == key
    assert len(points) == 8  # one per W of the stage
    assert w_offload.prefetch_points(tuple(zero_bubble(4, 8).ranks[0]), 8) == {}  # virtual stage 0: no W sets
