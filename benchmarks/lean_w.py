"""The lean W (hetauto.runtime.split_backward) against torch's split (torch.distributed.pipelining's
stage_backward_input / stage_backward_weight) and the unsplit backward, side by side in one run on this CPU.

A stage of tiny-gpt-like blocks (hidden 256, 4 heads, ffn 1024) takes microbatches of 4 x 128 tokens; each round
runs one microbatch each way (plain backward, lean I then W, torch's I then W, in rotating order so all three see
the same load), fp32. Printed: median seconds of I, W and I + W per way and their ratios to the plain backward,
and the bytes each split holds between I and W: the lean W's kept tensors (equal to the memory model's
costmodel.deferred_w_bytes, checked here) against torch's, whose retained graph keeps the activations (the
cost model's per-microbatch activation bytes) plus the output gradients it captured for W.

    python benchmarks/lean_w.py [--blocks N] [--rounds R] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hetauto.core.model import ModelConfig
from hetauto.planner.costmodel import LayerTable, deferred_w_bytes
from hetauto.planner.layers import layer_list
from hetauto.runtime.split_backward import LeanW, kept_bytes
from hetauto.runtime.stage import build_stage

B, S, H = 4, 128, 256


def _stages(blocks: int) -> tuple[ModelConfig, list]:
    cfg = ModelConfig("bench", "gpt", num_layers=blocks, hidden=H, num_heads=4, ffn_hidden=4 * H, vocab_size=512,
                      max_seq_len=S)
    return cfg, [build_stage(cfg, (1, blocks + 1), 0) for _ in range(3)]


def _torch_kept(groups: list) -> int:
    return sum(t.numel() * t.element_size() for g in groups for gs in g["grads"] for t in gs if t is not None)


def _round(way: str, st: torch.nn.Module, store: LeanW | None, x0: torch.Tensor, g: torch.Tensor) -> tuple:
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    x = x0.clone().requires_grad_()
    y = st(x)
    t0 = time.perf_counter()
    if way == "plain":
        y.backward(g)
        return time.perf_counter() - t0, 0.0, 0
    if way == "lean":
        assert store is not None
        kept = store.input_grads(y, g)
        t1 = time.perf_counter()
        nbytes = kept_bytes(kept)
        t2 = time.perf_counter()
        LeanW.weight_grads(kept)
        return t1 - t0, time.perf_counter() - t2, nbytes
    _, groups = stage_backward_input([y], [g], [x], iter(st.parameters()))
    t1 = time.perf_counter()
    nbytes = _torch_kept(groups)
    t2 = time.perf_counter()
    stage_backward_weight(iter(st.parameters()), groups)
    return t1 - t0, time.perf_counter() - t2, nbytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cfg, (plain, lean, split) = _stages(args.blocks)
    store = LeanW.install(lean)
    mods = {"plain": (plain, None), "lean": (lean, store), "torch split": (split, None)}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in mods}
    kept: dict[str, int] = {}
    torch.manual_seed(0)
    ways = list(mods)
    for r in range(args.rounds + 1):  # round 0 warms up
        x0, g = torch.randn(B, S, H), torch.randn(B, S, H)
        for way in ways[r % 3:] + ways[:r % 3]:
            i_s, w_s, nbytes = _round(way, *mods[way], x0, g)
            if r:
                times[way].append((i_s, w_s))
                kept[way] = nbytes
    table = LayerTable(tuple(la.at_compute_bytes(4) for la in layer_list(cfg, S)))  # fp32 here
    sums = table.range(1, args.blocks + 1)
    priced = deferred_w_bytes(sums, tp=1, dp=1, microbatch=B)
    acts = B * (sums.act_replicated + sums.act_sharded + sums.act_score)
    assert kept["lean"] == priced, (kept["lean"], priced)
    base = statistics.median(i for i, _ in times["plain"])
    rows = []
    for way, ts in times.items():
        i_s, w_s = statistics.median(i for i, _ in ts), statistics.median(w for _, w in ts)
        held = kept[way] + (acts if way == "torch split" else 0)
        rows.append({"way": way, "I_s": i_s, "W_s": w_s, "total_s": i_s + w_s, "vs_plain": (i_s + w_s) / base,
                     "held_between_I_and_W_bytes": held})
        print(f"{way:12s}  I {1e3 * i_s:7.2f} ms  W {1e3 * w_s:7.2f} ms  I+W {1e3 * (i_s + w_s):7.2f} ms  "
              f"x{(i_s + w_s) / base:.2f} of the plain backward" + ("" if way == "plain" else
              f"  held I..W {held / 2**20:6.1f} MiB"))
    lean_row, torch_row = rows[1], rows[2]
    print(f"lean vs torch's split: I+W x{lean_row['total_s'] / torch_row['total_s']:.2f}, "
          f"W x{lean_row['W_s'] / torch_row['W_s']:.2f}, held x{lean_row['held_between_I_and_W_bytes'] / torch_row['held_between_I_and_W_bytes']:.2f} "
          f"(lean kept = costmodel.deferred_w_bytes: {priced / 2**20:.1f} MiB; torch's: activations "
          f"{acts / 2**20:.1f} MiB priced + {kept['torch split'] / 2**20:.1f} MiB captured gradients)")
    if args.json:
        print(json.dumps({"blocks": args.blocks, "rounds": args.rounds, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
