"""`hetauto models`: the built-in model catalog."""

from __future__ import annotations

import argparse
from typing import Any

from hetauto.commands._output import print_json, print_table
from hetauto.core.model import ModelConfig
from hetauto.core.model_catalog import MODELS
from hetauto.planner.layers import total_params


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def model_row(m: ModelConfig) -> dict[str, Any]:
    return {"name": m.name, "arch": m.arch, "params": total_params(m), "layers": m.num_layers, "hidden": m.hidden,
            "heads": m.num_heads, "kv_heads": m.kv_heads, "ffn_hidden": m.ffn_hidden, "vocab": m.vocab_size,
            "max_seq_len": m.max_seq_len, "tie_embeddings": m.tie_embeddings}


def run(args: argparse.Namespace) -> int:
    rows = [model_row(m) for m in MODELS.values()]
    if args.json:
        print_json(rows)
        return 0
    print_table("Model catalog", ["name", "arch", "params", "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq"],
                [[r["name"], r["arch"], _count(r["params"]), r["layers"], r["hidden"], r["heads"], r["kv_heads"],
                  r["ffn_hidden"], r["vocab"], r["max_seq_len"]] for r in rows])
    return 0


def _count(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}K"
