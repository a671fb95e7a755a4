"""Fast iteration time of 1F1B-family schedules (1F1B, Virtual-1F1B), for the planner's inner loop.

Why: the discrete-event simulator (`hetauto.schedule.simulate`) is the reference, but a 16-stage,
256-microbatch plan is ~25k events there (tens of ms). For these schedules every rank's compute order is
fixed, so the iteration is a longest-path recursion over (rank, F/B, microbatch) in a precomputed
topological order, with the simulator's exact communication rules: a transfer starts when the sender has
issued it, the receiver has posted its receive (right after its compute `k - lookahead` of that kind), and
the directed link is free (FIFO); it arrives `serialization + latency` later. Link groups (shared
capacity): a group one boundary uses is folded into that link by the evaluator (exact); plans whose
groups several boundaries share go to the simulator.

For large m the recursion runs on `m0 = max(deepest warmup + TRANSIENT, EXACT_NODES / p)` microbatches
(cost O(p * m0): a 256-device, 16-stage plan is ~2k nodes, ~1-2 ms) and the rest is extrapolated with the steady-state
period lambda (the maximum cycle mean of the max-plus system):

    lambda = max( max_{r<=s} [sum_{q=r..s} (tf_q + tb_q) + sum_{h=r..s-1} (cf_h + cb_h)] / (w_r - w_s + 1),
                  (tf_r + cf_{r-1}) / d_r,  (tb_r + cb_r) / d_r,  serial_f_h,  serial_b_h )

with w_r the warmup forwards of rank r, d_r its receive lookahead and c = serialization + latency. Tests
check it against the simulator: exact (1e-12) without extrapolation; within 1e-2 with it (a long transient,
when a stage with deep warmup slowly uses up its slack, is the residual error; typically < 1e-3).
"""

from __future__ import annotations

from collections.abc import Sequence

EXACT_NODES = 1024  # run the recursion on at least this many (rank, microbatch) pairs before extrapolating
TRANSIENT = 8  # microbatches past the deepest warmup before the steady state is assumed


def period(tf: Sequence[float], tb: Sequence[float], warmups: Sequence[int], lookahead: Sequence[int],
           fwd: Sequence[tuple[float, float]], bwd: Sequence[tuple[float, float]]) -> tuple[float, int]:
    """Steady-state time per microbatch (see module docstring) and the number of microbatches the critical
    cycle spans (the iteration grows by lambda*adv every adv microbatches). fwd/bwd[h] = (serialization, latency)."""
    p = len(tf)
    cf = [s + lat for s, lat in fwd]
    cb = [s + lat for s, lat in bwd]
    lam, span = 0.0, 1

    def consider(value: float, adv: int) -> None:
        nonlocal lam, span
        if value > lam * (1 + 1e-12):
            lam, span = value, adv

    for r in range(p):
        acc = 0.0
        for s in range(r, p):
            acc += tf[s] + tb[s]
            if s > r:
                acc += cf[s - 1] + cb[s - 1]
            adv = warmups[r] - warmups[s] + 1
            if adv > 0:
                consider(acc / adv, adv)
        d = max(1, lookahead[r])
        if r > 0:
            consider((tf[r] + cf[r - 1]) / d, d)
        if r < p - 1:
            consider((tb[r] + cb[r]) / d, d)
    for s, _ in (*fwd, *bwd):
        consider(s, 1)
    return lam, span


def _recurse(p: int, m: int, tf: Sequence[float], tb: Sequence[float], warmups: tuple[int, ...],
             lookahead: Sequence[int], fwd: Sequence[tuple[float, float]],
             bwd: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """(rank end of compute, start of its last backward) per rank for m microbatches.

    Ranks are advanced round-robin, each as far as its inputs allow, which is a topological order of the
    (rank, F/B, microbatch) graph: a 1F1B-family rank's next action is F while it has fewer than its warmup
    forwards in flight (nf - nb <= w) and forwards remain, else B; F(r,k) needs F(r-1,k) done, B(r,k)
    needs B(r+1,k). Folding the order into the recursion (no separate order pass, no cache) halves the cost
    of a cold evaluation of a deep pipeline."""
    end_f = [[0.0] * m for _ in range(p)]
    end_b = [[0.0] * m for _ in range(p)]
    rank_t = [0.0] * p
    last_b = [0.0] * p
    free_f = [0.0] * p
    free_b = [0.0] * p
    nf = [0] * p
    nb = [0] * p
    look = [max(1, d) for d in lookahead]
    warm = [min(w, m) for w in warmups]
    remaining = 2 * p * m
    last = p - 1
    while remaining:
        progressed = False
        for r in range(p):
            t = rank_t[r]
            f_r, b_r = nf[r], nb[r]
            w, d = warm[r], look[r]
            ef, eb = end_f[r], end_b[r]
            while True:
                if f_r < m and f_r - b_r <= w:
                    k = f_r
                    if r > 0:
                        prev = end_f[r - 1]
                        if nf[r - 1] <= k:
                            break
                        a = prev[k]
                        if k >= d and ef[k - d] > a:
                            a = ef[k - d]
                        h = r - 1
                        if free_f[h] > a:
                            a = free_f[h]
                        ser, lat = fwd[h]
                        free_f[h] = a + ser
                        a += ser + lat
                        if a > t:
                            t = a
                    t += tf[r]
                    ef[k] = t
                    f_r += 1
                elif b_r < m:
                    k = b_r
                    if r < last:
                        if nb[r + 1] <= k:
                            break
                        a = end_b[r + 1][k]
                        if k >= d and eb[k - d] > a:
                            a = eb[k - d]
                        if free_b[r] > a:
                            a = free_b[r]
                        ser, lat = bwd[r]
                        free_b[r] = a + ser
                        a += ser + lat
                        if a > t:
                            t = a
                    if k == m - 1:
                        last_b[r] = t
                    t += tb[r]
                    eb[k] = t
                    b_r += 1
                else:
                    break
            done = (f_r - nf[r]) + (b_r - nb[r])
            if done:
                progressed = True
                remaining -= done
                nf[r], nb[r] = f_r, b_r
                rank_t[r] = t
        if not progressed:  # cannot happen for 1F1B-family lists; guard against an endless loop
            raise RuntimeError("1F1B order has a cycle")
    return rank_t, last_b


def iteration_1f1b(tf: Sequence[float], tb: Sequence[float], m: int, *, extra_warmup: Sequence[int] = (),
                   lookahead: Sequence[int] | None = None, fwd: Sequence[tuple[float, float]] = (),
                   bwd: Sequence[tuple[float, float]] | None = None, allreduce: Sequence[float] | None = None,
                   optim: Sequence[float] | None = None, dp_overlap: bool = False) -> tuple[float, float]:
    """(iteration time, bubble fraction) of 1F1B (`extra_warmup` empty) or Virtual-1F1B, matching
    `simulate(schedule, costs)` for link-group-free costs. `fwd[h]`/`bwd[h]`: (serialization, latency) of the
    activation h -> h+1 and of the gradient h+1 -> h; `lookahead` per rank as the generators set it."""
    p = len(tf)
    ks = tuple(extra_warmup) or (0,) * (p - 1)
    warm = tuple(p - r - 1 + sum(ks[r:]) for r in range(p))
    look = list(lookahead) if lookahead is not None else [1] * p
    fw = list(fwd) or [(0.0, 0.0)] * (p - 1)
    bw = list(bwd) if bwd is not None else fw
    ar = list(allreduce) if allreduce is not None else [0.0] * p
    op = list(optim) if optim is not None else [0.0] * p
    m0 = min(m, max(max(warm) + TRANSIENT, EXACT_NODES // p))
    lam, span = period(tf, tb, [min(w, m) for w in warm], look, fw, bw) if m0 < m else (0.0, 1)
    m0 = min(m, m0 + (m - m0) % span)  # extrapolate by whole critical cycles
    rank_t, last_b = _recurse(p, m0, tf, tb, tuple(min(w, m0) for w in warm), look, fw, bw)
    if m0 < m:
        shift = (m - m0) * lam
        rank_t = [x + shift for x in rank_t]
        last_b = [x + shift for x in last_b]
    total = 0.0
    for r in range(p):
        st = last_b[r] if dp_overlap else rank_t[r]
        comm = st + ar[r]
        end = max(rank_t[r], comm) + op[r]
        total = max(total, end, comm)
    busy = m * sum(a + b for a, b in zip(tf, tb))
    bubble = 1.0 - busy / (p * total) if total > 0 else 0.0
    return total, bubble
