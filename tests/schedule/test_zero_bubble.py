"""Zero-bubble schedules (issue 28): ZB-H1 and Virtual-ZB as action lists, checked, priced by the simulator in
closed form, and on a slow link against Virtual-1F1B."""

from __future__ import annotations

import json

import pytest

from hetauto.cli import main
from hetauto.schedule import (
    PipelineCosts, ScheduleError, boundary_links, check_schedule, one_f_one_b, simulate, virtual_1f1b, zb_inflight,
    zero_bubble,
)
from hetauto.schedule.actions import COMPUTE


def _compute_text(sched) -> list[str]:
    return [" ".join(str(a) for a in row if a.type in COMPUTE) for row in sched.ranks]


def test_zb_h1_action_lists() -> None:
    """Rank r: p-r-1 warm-up forwards, then F/I pairs with each W deferred by r input-backwards."""
    assert _compute_text(zero_bubble(2, 3)) == ["0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2",
                                                "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2"]
    assert _compute_text(zero_bubble(3, 4))[2] == "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3"
    s = zero_bubble(3, 4)
    assert s.name == "zb-h1" and s.extra_warmup == ()
    assert [str(a) for a in s.ranks[1][-3:]] == ["1W3", "1REDUCE_GRAD", "1OPTIM"]


@pytest.mark.parametrize("tf,tb,tw", [(1.0, 2.0, 1.0), (1.0, 2.0, 0.5), (2.0, 3.0, 1.0), (1.0, 2.0, 0.0)])
@pytest.mark.parametrize("p,m", [(2, 2), (3, 5), (4, 8), (4, 16), (8, 16)])
def test_zb_h1_closed_form(p: int, m: int, tf: float, tb: float, tw: float) -> None:
    """m(t_f+t_b) + (p-1)(t_f+t_i-t_w), t_i = t_b - t_w; p microbatches in flight everywhere (F to W)."""
    s = zero_bubble(p, m)
    check_schedule(s)
    r = simulate(s, PipelineCosts(tf=tf, tb=tb, tw=tw))
    assert r.iteration_time == pytest.approx(m * (tf + tb) + (p - 1) * (tf + (tb - tw) - tw), abs=1e-9)
    assert r.peak_inflight == tuple(zb_inflight(p, m, i) for i in range(p)) == (min(m, p),) * p


def test_w_share_prices_the_split_as_tw() -> None:
    a = simulate(zero_bubble(4, 8), PipelineCosts(tf=1.0, tb=2.0, w_share=0.5))
    b = simulate(zero_bubble(4, 8), PipelineCosts(tf=1.0, tb=2.0, tw=1.0))
    assert a.iteration_time == b.iteration_time == 27.0
    assert simulate(one_f_one_b(4, 8), PipelineCosts(tf=1.0, tb=2.0, w_share=0.5)).iteration_time == 33.0
    with pytest.raises(ScheduleError, match=r"w_share: shares of the backward must be in \[0, 1\]"):
        simulate(zero_bubble(2, 2), PipelineCosts(tf=1.0, tb=2.0, w_share=1.5))


@pytest.mark.parametrize("c", [3.0, 6.0])
def test_virtual_zb_reaches_the_slow_link_bound(c: float) -> None:
    """One-way cost c on boundary 1 of p=4, m=16 (F=1, I=W=1): Virtual-ZB reaches ZB-H1's time plus one round
    trip, 51 + 2c, where Virtual-1F1B takes 57 + 2c and ZB-H1 without the extra warm-up stalls."""
    costs = PipelineCosts(tf=1.0, tb=2.0, tw=1.0, links=boundary_links(4, {1: c}))
    vzb = zero_bubble(4, 16, boundary_cost=[0.0, c, 0.0])
    check_schedule(vzb)
    assert vzb.name == "virtual-zb" and vzb.extra_warmup == (0, int(2 * c / 3), 0)
    r = simulate(vzb, costs)
    assert r.iteration_time == 51.0 + 2 * c
    assert simulate(virtual_1f1b(4, 16, vzb.extra_warmup), costs).iteration_time == 57.0 + 2 * c
    assert simulate(zero_bubble(4, 16), costs).iteration_time > 51.0 + 2 * c + 10
    assert r.peak_inflight == tuple(zb_inflight(4, 16, i, vzb.extra_warmup) for i in range(4))


def test_memory_cap_limits_warmup_then_deferral() -> None:
    """A cap first limits the extra warm-up (over 1F1B's p - r, as Virtual-1F1B), then each stage's W deferral;
    every deferral step trades one microbatch of memory for less bubble."""
    s = zero_bubble(4, 16, (0, 4, 0), memory_cap=[6, 7, None, 3])
    assert (s.extra_warmup, s.defer) == ((0, 2, 0), (0, 1, 2, 2))
    costs = PipelineCosts(tf=1.0, tb=2.0, tw=1.0)
    capped = zero_bubble(4, 8, memory_cap=[4, 3, 3, 2])
    check_schedule(capped)
    r = simulate(capped, costs)
    assert capped.defer == (0, 0, 1, 1) and r.peak_inflight == (4, 3, 3, 2)
    assert r.peak_inflight == tuple(zb_inflight(4, 8, i, (), capped.defer) for i in range(4))
    none = zero_bubble(4, 8, defer=[0, 0, 0, 0])  # 1F1B's memory: W right after its I
    assert simulate(none, costs).peak_inflight == (4, 3, 2, 1)
    assert 27.0 == simulate(zero_bubble(4, 8), costs).iteration_time < r.iteration_time == 29.0 \
        < simulate(none, costs).iteration_time == 30.0 < simulate(one_f_one_b(4, 8), costs).iteration_time == 33.0


def test_plain_b_stage_in_a_zero_bubble_list() -> None:
    """defer -1 (PLAIN_B): that rank runs 1F1B's F / B order at ZB-H1's warm-up (no W held), the others still
    split; the checker takes the mixed lists and the simulator prices them between the split and 1F1B (unit
    model: 27 all split, 29 with stage 2 not deferring, 30 with stage 2 running B, 33 1F1B; all plain B is 1F1B)."""
    from hetauto.planner.costmodel import deferred_w_held, deferred_w_peak, inflight_microbatches
    from hetauto.schedule import PLAIN_B

    costs = PipelineCosts(tf=1.0, tb=2.0, tw=1.0)
    s = zero_bubble(4, 8, defer=(0, 1, PLAIN_B, 3), memory_cap=[None, None, 2, None])
    check_schedule(s)
    assert s.defer == (0, 1, -1, 3)
    assert _compute_text(s)[2] == "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7"
    assert _compute_text(s)[3] == _compute_text(zero_bubble(4, 8))[3]
    assert simulate(s, costs).iteration_time == 30.0
    assert simulate(zero_bubble(4, 8, defer=(0, 1, 0, 3)), costs).iteration_time == 29.0
    plain = zero_bubble(4, 8, defer=(PLAIN_B,) * 4)
    assert _compute_text(plain) == _compute_text(one_f_one_b(4, 8)) and simulate(plain, costs).iteration_time == 33.0
    assert simulate(s, costs).peak_inflight[2] == zb_inflight(4, 8, 2, (), s.defer) == 2
    assert inflight_microbatches("zb-h1", 4, 8, 2, w_defer=s.defer) == 2.0
    assert deferred_w_held("zb-h1", 4, 8, 2, w_defer=s.defer) == deferred_w_peak("zb-h1", 4, 8, 2, w_defer=s.defer) == 0


def test_first_stage_plain_b_overlaps_its_gradient_reduce() -> None:
    """Why the planner runs the first stage as plain B: its I has no input gradient to send, and a split stage's DP
    reduce starts only with its last W (the executor sums a split stage's gradients after its last W). p = 2, m = 4,
    unit model: stage 0's last backward starts at 11 (18 - 2 - 5 without overlap); a 5 s reduce overlapped from
    there ends at 16 after a B, at 17 from the W one I (1) later."""
    overlap = PipelineCosts(tf=1.0, tb=2.0, tw=1.0, allreduce=(5.0, 0.0), dp_overlap=True)
    after = PipelineCosts(tf=1.0, tb=2.0, tw=1.0, allreduce=(5.0, 0.0), dp_overlap=False)
    plain_b, split = zero_bubble(2, 4, defer=(-1, 1)), zero_bubble(2, 4, defer=(0, 1))
    assert simulate(plain_b, after).iteration_time == simulate(split, after).iteration_time == 18.0
    assert simulate(plain_b, overlap).iteration_time == 16.0 and simulate(split, overlap).iteration_time == 17.0


@pytest.mark.parametrize("p,m,extra,defer", [(4, 8, None, None), (4, 3, None, None), (4, 16, (1, 0, 2), None),
                                              (5, 12, None, (0, 1, 1, 0, 2)), (3, 4, (2, 2), (0, 5, 5)),
                                              (4, 16, (1, 0, 2), (-1, 1, -1, 3))])
def test_zb_memory_peaks_coincide(p: int, m: int, extra: tuple | None, defer: tuple | None) -> None:
    """Along each rank's list (F adds an activation, I turns it into a lean W set, W frees that, a plain B the
    activation) every moment holds at most inflight_microbatches activations, deferred_w_peak W sets and
    inflight + deferred_w_held microbatches from F to W, and the two corners stage_memory prices are reached:
    (inflight, held) and (inflight - (peak - held), peak), so its max of the two is the peak for any sizes;
    zb_windows counts the same."""
    from hetauto.planner.costmodel import deferred_w_held, deferred_w_peak, inflight_microbatches
    from hetauto.schedule import peak_deferred_w, zb_windows
    from hetauto.schedule.actions import ActionType as T

    s = zero_bubble(p, m, extra, defer=defer)
    name, ks = s.name, s.extra_warmup
    q = tuple(inflight_microbatches(name, p, m, r, extra_warmup=ks) for r in range(p))
    held = tuple(deferred_w_held(name, p, m, r, extra_warmup=ks, w_defer=s.defer) for r in range(p))
    peak = tuple(deferred_w_peak(name, p, m, r, w_defer=s.defer) for r in range(p))
    assert zb_windows(s) == tuple((q[r], q[r] + held[r], peak[r]) for r in range(p))
    assert peak_deferred_w(s) == peak
    for r, row in enumerate(s.ranks):
        a = g = 0
        states = set()
        for x in row:
            a, g = a + (x.type is T.F) - (x.type in (T.I, T.B)), g + (x.type is T.I) - (x.type is T.W)
            states.add((a, g))
        assert all(a <= q[r] and g <= peak[r] and a + g <= q[r] + held[r] for a, g in states)
        assert (q[r], held[r]) in states and (q[r] + held[r] - peak[r], peak[r]) in states


def test_zero_bubble_bad_input() -> None:
    with pytest.raises(ScheduleError, match=r"stage 0: memory cap 3 microbatches is below what 1F1B itself "
                                            r"holds there \(4\)"):
        zero_bubble(4, 8, (0, 0, 0), memory_cap=[3, None, None, None])
    with pytest.raises(ScheduleError, match=r"extra_warmup needs one entry per boundary \(3\), got 1"):
        zero_bubble(4, 8, (1,))
    with pytest.raises(ScheduleError, match=r"defer needs one entry >= 0 \(or -1: plain B\) per stage \(4\), got \[1\]"):
        zero_bubble(4, 8, defer=[1])


def test_simulate_cli_zero_bubble(capsys) -> None:
    base = ["simulate", "--synthetic", "--stages", "4", "--microbatches", "16", "--tf", "1", "--tb", "2", "--json"]
    assert main(base + ["--schedule", "virtual-zb", "--link-latency", "1:3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["iteration_time_s"] == doc["lower_bound_s"] == 57.0 and doc["extra_warmup"] == [0, 2, 0]
    assert main(base + ["--schedule", "zb-h1", "--tw", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] == 16 * 3 + 3 * 2.0
    assert main(base + ["--schedule", "zb-h1", "--tw", "3"]) == 2
    assert "--tw must be between 0 and --tb (2.0), got 3.0" in capsys.readouterr().err
    # ZB-V: the unit model's 50 at p = 4, m = 16 (I = W = 1), 2 chunks, no closed-form lower bound
    assert main(base + ["--schedule", "zb-v"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["iteration_time_s"], doc["virtual_chunks"]) == (50.0, 2) and "lower_bound_s" not in doc


@pytest.mark.parametrize("p,m,want", [(2, 4, 12.5), (4, 8, 26.0), (4, 16, 50.0), (8, 16, 51.5), (8, 32, 99.5)])
def test_zb_v_in_a_v(p: int, m: int, want: float) -> None:
    """ZB-V: two chunks per rank in a V (rank r holds stages r and 2p-1-r), checked and priced in the unit model;
    at most p whole-stage microbatches (2p chunks) in flight per rank. torch's ZBV: 25.5 / 49.5 at p=4, equal at
    p=8 (tests/schedule/test_torch_export.py)."""
    from hetauto.schedule import zb_v

    s = zb_v(p, m)
    assert s.placement == "v" and s.v == 2 and [s.owner(k) for k in (0, p - 1, p, 2 * p - 1)] == [0, p - 1, p - 1, 0]
    check_schedule(s)
    r = simulate(s, PipelineCosts(tf=1.0, tb=2.0, tw=1.0))
    assert r.iteration_time == want and max(r.peak_inflight) <= 2 * p
    assert r.iteration_time < simulate(zero_bubble(p, m), PipelineCosts(tf=1.0, tb=2.0, tw=1.0)).iteration_time
