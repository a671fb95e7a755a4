"""Resharding over a REAL shaped link: scatter+all-gather vs lanes (vs leader+broadcast), side by side.

Mirror of `resharding_link.py`, but the slow link is the kernel's: the source stage (dp=1, tp=2, ranks
0-1) lives in one network namespace, the destination stages (dp=1, tp=2 on ranks 2-3, and dp=1, tp=4 on
ranks 2-5) in another, joined by a veth pair rate-limited with `tc tbf` on both ends; gloo is bound to the
veth. All cross traffic of the boundary therefore shares one bottleneck, as on a cross-cluster link, and
the destination's all-gather runs over the namespace's local (unshaped) path. Needs root and iproute2
(see hetauto.launch.netns_topology); otherwise it says why and exits 0.

Per tp_d and method it prints the planned cross-link bytes, the bytes the kernel counted leaving the
source namespace's veth (TCP/IP headers and the timing all-reduce included), the measured transfer time
(median, max over ranks) and the wire model cross_bytes / rate; then lanes / scatter-allgather ratios of
bytes and time, which should both be close to tp_d. `--json`: the last line is one JSON document.

    python benchmarks/resharding_shaped.py [--quick] [--rate-mbps 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

SHAPE = (4, 256, 256)  # fp32: 1 MiB per microbatch activation
SRC_RANKS = [0, 1]
DST_RANKS = [2, 3, 4, 5]
TP_DS = (2, 4)

if __name__ == "__main__" and str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def _veth_tx() -> int:
    """Bytes this namespace's veth has sent (ip netns exec remounts /sys for the namespace)."""
    dev = os.environ["GLOO_SOCKET_IFNAME"]
    return int(Path(f"/sys/class/net/{dev}/statistics/tx_bytes").read_text())


def work(rank: int, world: int, reps: int) -> dict:
    """One rank of the benchmark (run inside its namespace by run_in_namespaces)."""
    import torch

    from hetauto.core.comm import Communicator
    from hetauto.runtime.resharding import METHODS, StageLayout, execute_transfer, plan_transfer

    comm = Communicator.init_from_env("gloo", timeout_s=60)
    src = StageLayout.contiguous(1, len(SRC_RANKS))
    groups = {tuple(DST_RANKS[:tp_d]): comm.new_group(DST_RANKS[:tp_d]) for tp_d in TP_DS}
    data = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    out: dict = {}
    tag = 0
    for tp_d in TP_DS:
        dst = StageLayout.contiguous(1, tp_d, first_rank=len(SRC_RANKS))
        local = {dst.ranks: groups[dst.ranks]}
        row: dict = {}
        for method in METHODS:
            plan = plan_transfer(src, dst, SHAPE, method)
            times, wire = [], []
            for rep in range(reps + 1):  # the first repetition opens the connections
                comm.barrier()
                tx0 = _veth_tx()
                t0 = time.perf_counter()
                mine = data if rank in src.ranks else None
                res = execute_transfer(comm, plan, mine, local_groups=local, tag_base=tag)
                elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                tag += plan.num_tags
                comm.all_reduce(elapsed, op="max")
                comm.barrier()
                sent = _veth_tx() - tx0
                if res is not None and not torch.equal(res, data):
                    raise AssertionError(f"{method} tp_d={tp_d}: rank {rank} received wrong data")
                if rep:
                    times.append(elapsed.item())
                    wire.append(sent)
            row[method] = {
                "cross_bytes": plan.cross_bytes(4),
                "veth_tx_bytes": int(statistics.median(wire)),
                "measured_s": statistics.median(times),
            }
        out[str(tp_d)] = row
    comm.destroy()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 repetitions instead of 7")
    ap.add_argument("--rate-mbps", type=float, default=10.0,
                    help="shaped rate in MB/s (1e6 bytes/s); slow enough that the wire dominates the local all-gather")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from hetauto.launch.netns_topology import NamespaceTopology, ShapedLinkError, available, run_in_namespaces

    avail = available()
    if not avail.ok:
        print(f"skipped: no shaped link here: {avail.reason}")
        if args.json:
            print(json.dumps({"skipped": True, "reason": avail.reason}))
        return 0
    rate = args.rate_mbps * 1e6
    reps = 3 if args.quick else 7
    try:
        with NamespaceTopology([SRC_RANKS, DST_RANKS], rate) as topo:
            res = run_in_namespaces(topo, f"{Path(__file__).resolve()}:work", [reps], timeout=300)[0]
    except ShapedLinkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"src (dp=1,tp=2) in one namespace -> dst (dp=1,tp=tp_d) in another; activation {SHAPE} fp32; "
          f"one veth shaped by tc tbf at {args.rate_mbps:g} MB/s each way; median of {reps}")
    print(f"{'tp_d':>4} {'method':<18} {'cross bytes':>12} {'veth tx bytes':>14} {'measured s':>11} "
          f"{'wire model s':>13}")
    summary: dict = {"rate_Bps": rate, "shape": list(SHAPE), "reps": reps, "tp_d": {}}
    for tp_d, row in res.items():
        for m, r in row.items():
            r["predicted_wire_s"] = r["cross_bytes"] / rate
            print(f"{tp_d:>4} {m:<18} {r['cross_bytes']:>12} {r['veth_tx_bytes']:>14} "
                  f"{r['measured_s']:>11.4f} {r['predicted_wire_s']:>13.4f}")
        lanes, sag = row["lanes"], row["scatter-allgather"]
        entry = {
            "bytes_ratio": lanes["cross_bytes"] / sag["cross_bytes"],
            "veth_bytes_ratio": lanes["veth_tx_bytes"] / sag["veth_tx_bytes"],
            "time_ratio": lanes["measured_s"] / sag["measured_s"],
            "methods": row,
        }
        summary["tp_d"][tp_d] = entry
        print(f"tp_d={tp_d}: lanes / scatter-allgather: bytes x{entry['bytes_ratio']:.2f} "
              f"(veth x{entry['veth_bytes_ratio']:.2f}), time x{entry['time_ratio']:.2f}")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
