"""Resharding over an emulated slow link: scatter+all-gather vs lanes (vs leader+broadcast), side by side.

Source stage (dp=1, tp=2) on ranks 0-1, destination stage (dp=1, tp=TP_D) on the next ranks; every
source rank's sends toward the destination share one emulated wire (its NIC: latency + bytes/bandwidth).
Prints cross-link bytes and the measured transfer time per method, and the lanes / scatter-allgather
ratios, which should both be close to TP_D. `--json`: the last line is one JSON document.

    python benchmarks/resharding_link.py [--quick] [--tp-d 2|4] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SHAPE = (4, 256, 256)  # fp32: 1 MiB per microbatch activation
LATENCY_S = 0.002
BANDWIDTH_BPS = 25e6


def _work(rank: int, world: int, tp_d: int, reps: int) -> dict:
    import torch

    from hetauto.core.comm import Communicator
    from hetauto.runtime.links import EmulatedLink, LinkTable
    from hetauto.runtime.resharding import METHODS, StageLayout, execute_transfer, plan_transfer

    src, dst = StageLayout.contiguous(1, 2), StageLayout.contiguous(1, tp_d, first_rank=2)
    comm = Communicator.init_from_env("gloo", timeout_s=60)
    tp_group = comm.new_group(list(dst.ranks))
    groups = {dst.ranks: tp_group}
    data = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    out: dict = {}
    for method in METHODS:
        plan = plan_transfer(src, dst, SHAPE, method)
        times = []
        for rep in range(reps + 1):  # first rep warms up connections
            table = LinkTable.between(src.ranks, dst.ranks, EmulatedLink(LATENCY_S, BANDWIDTH_BPS), shared=True)
            comm.links = table
            comm.barrier()
            t0 = time.perf_counter()
            res = execute_transfer(comm, plan, data if rank in src.ranks else None, local_groups=groups, tag_base=rep * 10_000)
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            comm.links = None
            table.close()
            comm.all_reduce(elapsed, op="max")
            if res is not None and not torch.equal(res, data):
                raise AssertionError(f"{method}: rank {rank} received wrong data")
            if rep:
                times.append(elapsed.item())
        per_sender: dict[int, int] = {}
        for (s, _), n in plan.bytes_per_link(4).items():
            per_sender[s] = per_sender.get(s, 0) + n
        out[method] = {
            "cross_bytes": plan.cross_bytes(4),
            "max_sender_bytes": max(per_sender.values()),
            "measured_s": statistics.median(times),
            "predicted_wire_s": LATENCY_S + max(per_sender.values()) / BANDWIDTH_BPS,
        }
    comm.destroy()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 repetitions instead of 7")
    ap.add_argument("--tp-d", type=int, choices=(2, 4), default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from hetauto.testing.multiproc import run_ranks

    reps = 3 if args.quick else 7
    res = run_ranks(_work, 2 + args.tp_d, args.tp_d, reps, timeout=300)[0]
    print(f"src (dp=1,tp=2) -> dst (dp=1,tp={args.tp_d}); activation {SHAPE} fp32; "
          f"link {LATENCY_S * 1e3:g} ms + {BANDWIDTH_BPS / 1e6:g} MB/s per sender NIC; median of {reps}")
    print(f"{'method':<18} {'cross bytes':>12} {'max/sender':>11} {'measured s':>11} {'wire model s':>13}")
    for m, r in res.items():
        print(f"{m:<18} {r['cross_bytes']:>12} {r['max_sender_bytes']:>11} {r['measured_s']:>11.4f} {r['predicted_wire_s']:>13.4f}")
    lanes, sag = res["lanes"], res["scatter-allgather"]
    summary = {
        "tp_d": args.tp_d,
        "bytes_ratio": lanes["cross_bytes"] / sag["cross_bytes"],
        "time_ratio": lanes["measured_s"] / sag["measured_s"],
        "methods": res,
    }
    print(f"lanes / scatter-allgather: bytes x{summary['bytes_ratio']:.2f}, time x{summary['time_ratio']:.2f}")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
