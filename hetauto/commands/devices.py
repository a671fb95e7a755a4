"""`hetauto devices`: the built-in device profile catalog."""

from __future__ import annotations

import argparse

from hetauto.commands._output import print_json, print_table
from hetauto.core.profile import catalog
from hetauto.core.units import format_bandwidth, format_bytes, format_flops


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    devices = catalog()
    if args.json:
        # peak_flops stays one number (the primary: bf16 where listed); the per-dtype map beside it
        print_json([{"key": k, **d.to_document(), "peak_flops": d.peak_flops,
                     "peak_flops_by_dtype": dict(d.peak_flops_by_dtype) or {"any": d.peak_flops}}
                    for k, d in devices.items()])
        return 0
    print_table("Device catalog (dense BF16/FP16; * = rough estimate)",
                ["key", "name", "backend", "peak", "memory", "mem bw", "intra-node", "NIC", "max eff"],
                [[k + ("*" if d.estimated else ""), d.name, d.backend, format_flops(d.peak_flops),
                  format_bytes(d.memory_bytes), f"{d.memory_bandwidth_Bps / 1e12:.3g}TB/s",
                  f"{d.intra_node_bandwidth_Bps / 1e9:.4g}GB/s", format_bandwidth(d.nic_bandwidth_Bps),
                  f"{d.efficiency_model.max_eff:.2f}"] for k, d in devices.items()])
    return 0
