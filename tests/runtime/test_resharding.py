"""Resharding between stage layouts: the pure plan over the whole (dp, tp) <= 4 grid, and real gloo transfers."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from hetauto.core.errors import InfeasiblePlan
from hetauto.runtime.resharding import METHODS, StageLayout, TransferPlan, plan_transfer

GRID = [(dp, tp) for dp in range(1, 5) for tp in range(1, 5)]
SHAPE = (12, 2, 3)  # b = 12 is divisible by every dp in 1..4


def simulate(plan: TransferPlan, data: np.ndarray) -> dict[int, np.ndarray]:
    """Carry out `plan` on numpy buffers, using only data each rank actually holds at each point."""
    flat = data.reshape(-1)
    held = {r: (plan.src_range(r), flat[slice(*plan.src_range(r))].copy()) for r in plan.src.ranks}
    out = {r: np.full(plan.dst_range(r)[1] - plan.dst_range(r)[0], np.nan) for r in plan.dst.ranks}
    for m in plan.messages:
        (s0, s1), buf = held[m.src]
        assert s0 <= m.start < m.stop <= s1, f"rank {m.src} does not hold {m}"
        d0, d1 = plan.dst_range(m.dst)
        assert d0 <= m.start < m.stop <= d1, f"rank {m.dst} does not need {m}"
        assert np.isnan(out[m.dst][m.start - d0 : m.stop - d0]).all(), f"{m} overwrites received data"
        out[m.dst][m.start - d0 : m.stop - d0] = buf[m.start - s0 : m.stop - s0]
    for step in plan.local:
        base = plan.dst_range(step.ranks[0])[0]
        assert all(plan.dst_range(r)[0] == base for r in step.ranks)
        if step.kind == "broadcast":
            a, z = step.chunks[0]
            root = out[step.ranks[step.root]][a - base : z - base].copy()
            assert not np.isnan(root).any(), "broadcast root lacks data"
            for r in step.ranks:
                out[r][a - base : z - base] = root
        else:
            pieces = []
            for r, (a, z) in zip(step.ranks, step.chunks):
                piece = out[r][a - base : z - base].copy()
                assert not np.isnan(piece).any(), f"rank {r} lacks its all-gather chunk"
                pieces.append((a, z, piece))
            for r in step.ranks:
                for a, z, piece in pieces:
                    out[r][a - base : z - base] = piece
    return out


@pytest.mark.parametrize("method", METHODS)
def test_every_layout_pair_in_grid_is_exact_with_expected_cross_bytes(method: str) -> None:
    data = np.arange(np.prod(SHAPE), dtype=np.float64).reshape(SHAPE) * 1.5 + 0.25
    total = data.size
    for (dps, tps), (dpd, tpd) in itertools.product(GRID, GRID):
        src = StageLayout.contiguous(dps, tps)
        dst = StageLayout.contiguous(dpd, tpd, first_rank=dps * tps)
        plan = plan_transfer(src, dst, SHAPE, method)
        case = f"{method} ({dps},{tps})->({dpd},{tpd})"
        got = simulate(plan, data)
        for r in dst.ranks:
            i, _ = dst.coords(r)
            b = SHAPE[0] // dpd
            assert np.array_equal(got[r], data[i * b : (i + 1) * b].reshape(-1)), case
        # how often each element crosses between the stages
        crossings = Counter()
        for m in plan.messages:
            crossings.update(range(m.start, m.stop))
        want = tpd if method == "lanes" else 1
        assert set(crossings.values()) == {want} and len(crossings) == total, case
        assert plan.cross_bytes(4) == want * total * 4, case
        assert sum(plan.bytes_per_link(2).values()) == want * total * 2, case
        assert len({m.tag for m in plan.messages}) == len(plan.messages), case
        if method == "scatter-allgather":
            # each destination dp slice is sent by k = min(tp_s, tp_d) senders per source dp slice, evenly
            k = min(tps, tpd)
            per_slice: dict[tuple[int, int], Counter] = {}
            for m in plan.messages:
                key = (dst.coords(m.dst)[0], src.coords(m.src)[0])
                per_slice.setdefault(key, Counter())[m.src] += m.numel
            for key, load in per_slice.items():
                assert len(load) == k, (case, key, load)
                assert max(load.values()) - min(load.values()) <= 1, (case, key, load)
            assert len(plan.local) == (dpd if tpd > 1 else 0)
        if method == "leader-broadcast":
            assert {m.dst for m in plan.messages} == {dst.rank(i, 0) for i in range(dpd)}, case


def test_backward_is_the_swapped_plan_and_symmetric_in_bytes() -> None:
    data = np.arange(np.prod(SHAPE), dtype=np.float64).reshape(SHAPE)
    for (dps, tps), (dpd, tpd) in [((1, 2), (2, 1)), ((2, 2), (1, 4)), ((4, 1), (1, 4))]:
        fwd = plan_transfer(StageLayout.contiguous(dps, tps), StageLayout.contiguous(dpd, tpd, 8), SHAPE)
        bwd = plan_transfer(fwd.dst, fwd.src, SHAPE)
        got = simulate(bwd, data)
        for r in fwd.src.ranks:
            a, z = bwd.dst_range(r)
            assert np.array_equal(got[r], data.reshape(-1)[a:z])
        assert fwd.cross_bytes() == bwd.cross_bytes() == data.size * 4


def test_cross_bytes_closed_form_example() -> None:
    # microbatch [8, 16, 32] fp16 = 8192 bytes; tp_d = 4: lanes 4x, the other two 1x
    src, dst = StageLayout.contiguous(2, 2), StageLayout.contiguous(1, 4, 4)
    s = 8 * 16 * 32 * 2
    assert plan_transfer(src, dst, (8, 16, 32), "lanes").cross_bytes(2) == 4 * s
    assert plan_transfer(src, dst, (8, 16, 32), "leader-broadcast").cross_bytes(2) == s
    sag = plan_transfer(src, dst, (8, 16, 32), "scatter-allgather")
    assert sag.cross_bytes(2) == s
    # each of the 4 receivers gets a quarter and lacks three quarters after the scatter
    assert sag.local_bytes(2) == 4 * (3 * s // 4)
    # senders: source tp ranks 0 and 1 of both dp replicas, each sends a quarter of the microbatch
    per_src = Counter()
    for (a, _), n in sag.bytes_per_link(2).items():
        per_src[a] += n
    assert per_src == {0: s // 4, 1: s // 4, 2: s // 4, 3: s // 4}


def test_bad_layouts_are_rejected_with_the_fix() -> None:
    with pytest.raises(InfeasiblePlan, match=r"microbatch of 6 samples cannot be split across the destination stage's dp=4"):
        plan_transfer(StageLayout.contiguous(1, 1), StageLayout.contiguous(4, 1, 1), (6, 2, 2))
    with pytest.raises(InfeasiblePlan, match="unknown resharding method 'ring'; use one of lanes"):
        plan_transfer(StageLayout.contiguous(1, 1), StageLayout.contiguous(1, 1, 1), (2, 2, 2), "ring")
    with pytest.raises(InfeasiblePlan, match=r"dp=2 tp=2 needs 4 distinct ranks, got \[0, 1, 1, 2\]"):
        StageLayout(2, 2, (0, 1, 1, 2))


def test_plan_module_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, hetauto.runtime.resharding; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------------------------- real gloo transfers

GLOO_CASES = [((1, 2), (2, 1)), ((2, 2), (1, 4)), ((1, 4), (4, 1)), ((2, 1), (2, 2))]
GLOO_SHAPE = (4, 3, 5)


def _gloo_cases(rank: int, world: int) -> list[tuple[str, bool, str]]:
    import torch

    from hetauto.core.comm import Communicator
    from hetauto.runtime.links import EmulatedLink, LinkTable
    from hetauto.runtime.resharding import execute_transfer

    comm = Communicator.init_from_env("gloo", timeout_s=20)
    # the destination TP group of case (2,2)->(1,4) as a real communicator (created collectively by all ranks)
    tp4 = comm.new_group([4, 5, 6, 7])
    results = []
    case_id = 0
    pairs = [
        (StageLayout.contiguous(dps, tps), StageLayout.contiguous(dpd, tpd, first_rank=dps * tps))
        for (dps, tps), (dpd, tpd) in GLOO_CASES
    ]
    # stages sharing ranks (in another order): self-messages become local copies
    pairs.append((StageLayout(2, 2, (0, 1, 2, 3)), StageLayout(1, 2, (3, 0))))
    for fwd_src, fwd_dst in pairs:
        for direction, (src, dst) in (("fwd", (fwd_src, fwd_dst)), ("bwd", (fwd_dst, fwd_src))):
            for method in METHODS:
                for use_groups in ((False, True) if dst.ranks == (4, 5, 6, 7) and dst.tp == 4 else (False,)):
                    case_id += 1
                    dtype = torch.bfloat16 if case_id % 3 == 0 else torch.float32
                    name = f"{method} {direction} ({src.dp},{src.tp})->({dst.dp},{dst.tp}) {dtype} groups={use_groups}"
                    plan = plan_transfer(src, dst, GLOO_SHAPE, method)
                    if rank not in src.ranks and rank not in dst.ranks:
                        continue
                    g = torch.Generator().manual_seed(case_id)
                    full = (torch.randn(GLOO_SHAPE, generator=g) * 1e3).to(dtype)
                    mine = None
                    if rank in src.ranks:
                        i, _ = src.coords(rank)
                        b = GLOO_SHAPE[0] // src.dp
                        mine = full[i * b : (i + 1) * b].clone()
                    links = LinkTable.between(
                        src.ranks, [r for r in dst.ranks if r not in src.ranks], EmulatedLink(0.0)
                    )
                    comm.links = links
                    before = comm.sent_bytes()
                    groups = {(4, 5, 6, 7): tp4} if use_groups else None
                    out = execute_transfer(comm, plan, mine, dtype=dtype, local_groups=groups, tag_base=case_id * 1000)
                    after = comm.sent_bytes()
                    comm.links = None
                    links.close()
                    ok, why = True, ""
                    if rank in dst.ranks:
                        i, _ = dst.coords(rank)
                        b = GLOO_SHAPE[0] // dst.dp
                        want = full[i * b : (i + 1) * b]
                        ok = out is not None and out.dtype == dtype and torch.equal(out, want)
                        why = "" if ok else f"rank {rank} got a different slice"
                    itemsize = torch.empty((), dtype=dtype).element_size()
                    planned = {
                        k: v for k, v in plan.bytes_per_link(itemsize).items() if k[0] == rank and k[1] not in src.ranks
                    }
                    cross = {
                        k: after[k] - before.get(k, 0) for k in after
                        if k[0] == rank and rank in src.ranks and k[1] in dst.ranks and k[1] not in src.ranks
                        and after[k] != before.get(k, 0)
                    }
                    overlap = bool(set(src.ranks) & set(dst.ranks))  # local-step traffic would mix in
                    if not overlap and (cross != planned or links.bytes_per_link() != planned):
                        ok, why = False, f"rank {rank} sent {cross}, link table {links.bytes_per_link()}, planned {planned}"
                    results.append((name, ok, why))
    comm.barrier()
    # a source that never sends: the destination fails within the timeout, naming the source rank
    if rank == 2:
        plan = plan_transfer(StageLayout.contiguous(1, 1), StageLayout.contiguous(1, 1, first_rank=2), GLOO_SHAPE)
        try:
            execute_transfer(comm, plan, None, timeout_s=1.0, tag_base=plan.num_tags * 10**6)
            results.append(("dead source", False, "no error"))
        except Exception as exc:  # noqa: BLE001
            msg = str(exc)
            ok = type(exc).__name__ == "CommunicationError" and msg.startswith("rank 2: recv from rank 0 (tag ")
            results.append(("dead source", ok, msg))
    comm.destroy()
    return results


@pytest.mark.multiprocess
def test_gloo_transfers_bit_exact_both_directions_with_bytes_counted() -> None:
    from hetauto.testing.multiproc import run_ranks

    per_rank = run_ranks(_gloo_cases, 8, timeout=120)
    failures = [f"{name}: {why}" for res in per_rank for name, ok, why in res if not ok]
    assert not failures, failures
    names = {name for res in per_rank for name, _, _ in res}
    # 5 layout pairs x 2 directions x 3 methods, plus (2,2)->(1,4) with a real TP-group communicator
    assert len(names) == 5 * 2 * 3 + 3 + 1
    assert sum("groups=True" in n for n in names) == 3
