from __future__ import annotations

import itertools

import pytest

from hetauto.schedule import (
    Link, PipelineCosts, ScheduleError, boundary_links, extra_warmup_from_costs, gpipe, interleaved, one_f_one_b,
    simulate, virtual_1f1b,
)

TF, TB = 1.5, 2.5


@pytest.mark.parametrize("p,m", list(itertools.product([1, 2, 4, 7], [1, 3, 8, 16])))
def test_gpipe_and_1f1b_oracles(p: int, m: int) -> None:
    for sched, peak in ((gpipe(p, m), [m] * p), (one_f_one_b(p, m), [min(m, p - i) for i in range(p)])):
        r = simulate(sched, PipelineCosts(tf=TF, tb=TB))
        assert r.iteration_time == pytest.approx((m + p - 1) * (TF + TB), rel=1e-12)
        assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
        assert list(r.peak_inflight) == peak
        assert r.utilisation == pytest.approx([m / (m + p - 1)] * p)


@pytest.mark.parametrize("p,k,v", list(itertools.product([2, 3, 4, 8], [1, 2, 3], [2, 3, 4])))
def test_interleaved_oracle(p: int, k: int, v: int) -> None:
    m = p * k
    r = simulate(interleaved(p, m, v), PipelineCosts(tf=TF, tb=TB))
    assert r.iteration_time == pytest.approx(m * (TF + TB) + (p - 1) * (TF + TB) / v, rel=1e-12)
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
    assert list(r.peak_inflight) == [min(m * v, 2 * (p - i - 1) + (v - 1) * p + 1) for i in range(p)]


def _slow(p: int, m: int, h: int, c: float, sched) -> float:
    return simulate(sched, PipelineCosts(tf=TF, tb=TB, links=boundary_links(p, {h: c}))).iteration_time


@pytest.mark.parametrize("p,m,h,c", [(4, 16, 1, 3.0), (4, 32, 0, 9.0), (6, 24, 3, 5.5), (8, 64, 6, 20.0), (3, 12, 1, 0.7)])
def test_slow_boundary_virtual_1f1b_reaches_lower_bound(p: int, m: int, h: int, c: float) -> None:
    t_star = (m + p - 1) * (TF + TB) + 2 * c
    cost = [0.0] * (p - 1)
    cost[h] = c
    ks = extra_warmup_from_costs(cost, TF, TB)
    assert ks[h] == -(-2 * c // (TF + TB))
    v1 = _slow(p, m, h, c, virtual_1f1b(p, m, ks))
    assert v1 == pytest.approx(t_star, rel=0.01)
    assert v1 >= t_star - 1e-9  # it is a lower bound
    plain = _slow(p, m, h, c, one_f_one_b(p, m))
    assert plain > 1.01 * t_star
    short = list(ks)
    short[h] -= 1
    assert _slow(p, m, h, c, virtual_1f1b(p, m, short)) > 1.01 * t_star


def test_memory_cap_degrades_gracefully() -> None:
    p, m, h, c = 4, 32, 2, 12.0  # k = ceil(24/4) = 6 on boundary 2
    ks = extra_warmup_from_costs([0, 0, c], TF, TB)
    assert ks == (0, 0, 6)
    times, kept = [], []
    for cap0 in range(p, p + 8):  # stage 0's memory in microbatches; the others unconstrained
        caps = [cap0, 99, 99, 99]
        s = virtual_1f1b(p, m, ks, memory_cap=caps)
        kept.append(s.extra_warmup[h])
        r = simulate(s, PipelineCosts(tf=TF, tb=TB, links=boundary_links(p, {h: c})))
        assert r.peak_inflight[0] <= cap0
        times.append(r.iteration_time)
    assert kept == [0, 1, 2, 3, 4, 5, 6, 6]
    assert all(a >= b for a, b in zip(times, times[1:]))  # more memory never hurts
    assert times[0] == pytest.approx(_slow(p, m, h, c, one_f_one_b(p, m)))
    assert times[-1] == pytest.approx((m + p - 1) * (TF + TB) + 2 * c)


def test_bandwidth_bound_link() -> None:
    p, S, B = 4, 6.0, 1.0  # serialization s = 6 per microbatch per direction > t_f + t_b = 4
    s = S / B
    links = (None, Link(0.0, B), None)
    over = {}
    for m in (32, 128):
        costs = PipelineCosts(tf=TF, tb=TB, links=links, act_bytes=S)
        for sched in (gpipe(p, m), one_f_one_b(p, m), interleaved(p, m, 2),
                      virtual_1f1b(p, m, boundary_cost=[0, s, 0], tf=TF, tb=TB)):
            t = simulate(sched, costs).iteration_time
            assert t >= m * s  # the link bounds every schedule
            over[(sched.name, m)] = t - m * s
    # with enough microbatches in flight the link streams back to back: T = m*s + a constant fill/drain,
    # so T/(m*s) -> 1 (1.125 at m=32, 1.031 at m=128)
    assert over[("virtual-1f1b", 32)] == over[("virtual-1f1b", 128)] == pytest.approx(4 * s)
    # plain 1F1B holds too few microbatches to cover the link's round trip: it pays per microbatch
    assert over[("1f1b", 128)] > 3 * over[("1f1b", 32)]


def test_heterogeneous_slowest_stage_bounds_steady_state() -> None:
    tf = [1.0, 1.0, 3.0, 1.0]
    tb = [2.0, 2.0, 6.0, 2.0]
    for m in (8, 32):
        r1 = simulate(one_f_one_b(4, m), PipelineCosts(tf=tf, tb=tb))
        # the slow stage never idles once started: fill = upstream forwards, drain = upstream backwards
        assert r1.iteration_time == pytest.approx(m * 9.0 + (1 + 1) + (2 + 2))
        assert r1.utilisation[2] == pytest.approx(m * 9.0 / r1.iteration_time)
        rg = simulate(gpipe(4, m), PipelineCosts(tf=tf, tb=tb))
        assert rg.iteration_time == pytest.approx(m * 9.0 + 3 + 3 + 3)


def test_per_chunk_times_and_tp_and_dp_tail() -> None:
    p, m, v = 2, 4, 2
    # per-virtual-stage times (p*v entries) equal to the per-rank split give the same answer
    a = simulate(interleaved(p, m, v), PipelineCosts(tf=[2.0, 2.0], tb=[4.0, 4.0]))
    b = simulate(interleaved(p, m, v), PipelineCosts(tf=[1.0] * 4, tb=[2.0] * 4))
    assert a.iteration_time == b.iteration_time == pytest.approx(m * 6 + (p - 1) * 6 / v)
    # TP time is compute time
    c = simulate(one_f_one_b(3, 5), PipelineCosts(tf=1.0, tb=2.0, tp_f=0.5, tp_b=0.5))
    assert c.iteration_time == pytest.approx(7 * 4.0)
    # DP all-reduce after the last backward, then the optimizer
    base = (5 + 3 - 1) * 3.0
    d = simulate(one_f_one_b(3, 5), PipelineCosts(tf=1.0, tb=2.0, allreduce=[10.0, 0.0, 0.0], optim=1.0))
    assert d.iteration_time == pytest.approx(base + 10.0 + 1.0)
    # overlapped with the last backward (2.0 long) it hides 2.0 of it
    e = simulate(one_f_one_b(3, 5), PipelineCosts(tf=1.0, tb=2.0, allreduce=[10.0, 0.0, 0.0], optim=1.0, dp_overlap=True))
    assert e.iteration_time == pytest.approx(base + 8.0 + 1.0)


def test_link_groups_share_capacity() -> None:
    # interleaved p=2, v=2: activations go 0->1 (chunk boundary) and 1->0 (wrap-around) at the same time
    p, m, v = 2, 8, 2

    def run(cap: float | None) -> float:
        group = None if cap is None else "x"
        costs = PipelineCosts(tf=1.0, tb=1.0, act_bytes=4.0, links=(Link(0, 1.0, group), Link(0, 1.0, group)),
                              link_groups={} if cap is None else {"x": cap})
        return simulate(interleaved(p, m, v), costs).iteration_time

    solo = run(None)
    times = [run(cap) for cap in (0.25, 0.5, 1.0, 2.0, float("inf"))]
    assert times[-1] == solo == 107.5  # an unbounded group changes nothing
    assert all(a >= b for a, b in zip(times, times[1:]))
    assert times[0] > times[2] > solo
    # a group at capacity 0.25 carries 2*(2v-1)*m = 48 transfers of 4 bytes one at a time
    assert times[0] >= 48 * 4 / 0.25


def test_latency_is_exact_for_one_microbatch() -> None:
    # one microbatch: F0 F1 F2, B2 B1 B0 with a one-way latency of 0.25 on both boundaries, each way
    r = simulate(one_f_one_b(3, 1), PipelineCosts(tf=1.0, tb=2.0, links=boundary_links(3, {0: 0.25, 1: 0.25})))
    assert r.iteration_time == pytest.approx(3 * 3.0 + 4 * 0.25)


def test_timeline_records_compute_and_links() -> None:
    r = simulate(one_f_one_b(2, 2), PipelineCosts(tf=1.0, tb=2.0, links=boundary_links(2, {0: 0.5})), timeline=True)
    assert r.timeline is not None
    kinds = {(e.resource, e.kind) for e in r.timeline}
    assert {("stage 0", "F"), ("stage 1", "B"), ("link 0->1", "SEND_F"), ("link 1->0", "SEND_B")} <= kinds
    f0 = next(e for e in r.timeline if e.resource == "stage 0" and e.kind == "F" and e.microbatch == 0)
    assert (f0.start, f0.end) == (0.0, 1.0)
    assert simulate(one_f_one_b(2, 2), PipelineCosts(tf=1.0, tb=2.0)).timeline is None


@pytest.mark.parametrize("costs,msg", [
    (PipelineCosts(tf=-1.0, tb=1.0), "tf: times must be >= 0"),
    (PipelineCosts(tf=[1.0, 1.0], tb=1.0), "tf: expected 3 or 3 values, got 2"),
    (PipelineCosts(tf=1.0, tb=1.0, links=(Link(0, 1.0, "g"),)), "link 0->1: unknown link group 'g'"),
    (PipelineCosts(tf=1.0, tb=1.0, links=(Link(-1.0),)), "link 0->1: latency must be >= 0 and bandwidth > 0"),
])
def test_cost_errors(costs: PipelineCosts, msg: str) -> None:
    with pytest.raises(ScheduleError, match=msg):
        simulate(one_f_one_b(3, 2), costs)
