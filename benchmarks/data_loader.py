"""Is the data loader ever the bottleneck? Samples per second a token file gives (hetauto.runtime.batches:
a step's global batch of windows from a memory-mapped .bin) next to the samples per second the executor
consumes on the cpu-demo plan, measured in one run. Target: loader >= 10x consumption. The same tokens as a
Hugging Face datasets folder (save_to_disk, 4 Arrow shards: hetauto.runtime.hf_dataset) get a row of their
own when the datasets package is installed.

Why these two: every first and last stage rank builds the step's global batch itself before its first
forward (no prefetch thread), so loader time is on the critical path: it must be small next to a step.

    python benchmarks/data_loader.py [--steps N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _token_file(folder: Path, tokens: int = 2_000_000) -> Path:
    import numpy as np

    from hetauto.runtime.token_data import write_tokens

    text = np.frombuffer(b"the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. " * 64,
                         dtype=np.uint8).astype(np.int64)
    reps = tokens // len(text) + 1
    return write_tokens(folder / "train.bin", [np.tile(text, reps)[:tokens]], vocab_size=256)


def _dataset_folder(path: Path, folder: Path, row: int = 1000) -> Path | None:
    """The token file's ids as a datasets folder of `row`-token rows in 4 shards (None without datasets)."""
    try:
        import datasets
    except ImportError:
        return None
    import numpy as np

    ids = np.fromfile(path, dtype=np.uint16).astype(np.int32)
    rows = [ids[i : i + row].tolist() for i in range(0, ids.size, row)]
    out = folder / "train-ds"
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(out), num_shards=4)
    return out


def loader_rate(path: Path, global_batch: int, seq_len: int, steps: int) -> float:
    """Samples per second of BatchSource.train over `steps` steps (median of 5 timed rounds)."""
    from hetauto.runtime.batches import BatchSource

    src = BatchSource(0, 256, str(path))
    src.train(0, global_batch, seq_len)  # open and page in once
    rounds = []
    for r in range(5):
        t = time.perf_counter()
        for s in range(steps):
            src.train(r * steps + s, global_batch, seq_len)
        rounds.append(steps * global_batch / (time.perf_counter() - t))
    return statistics.median(rounds)


def executor_rate(path: Path, folder: Path, steps: int) -> tuple[float, dict]:
    """Samples per second `hetauto run` trains on the cpu-demo plan with --data (median step after the first)."""
    plan = folder / "plan.json"
    subprocess.run([sys.executable, "-m", "hetauto.cli", "plan", "--scenario", "cpu-demo", "-o", str(plan)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([sys.executable, "-m", "hetauto.cli", "run", str(plan), "--steps", str(steps), "--emulate",
                          "--json", "--no-reference", "--data", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"hetauto run failed: {out.stderr.strip().splitlines()[-1:]}")
    doc = json.loads(out.stdout)
    gbs = json.loads(plan.read_text())["global_batch"]
    return gbs / doc["measured_step_s"], {"global_batch": gbs, "seq_len": json.loads(plan.read_text())["seq_len"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6, help="training steps of the executor run (default 6)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _token_file(folder)
        consumed, shape = executor_rate(path, folder, args.steps)
        loaded = loader_rate(path, shape["global_batch"], shape["seq_len"], steps=50)
        ds = _dataset_folder(path, folder)
        from_ds = loader_rate(ds, shape["global_batch"], shape["seq_len"], steps=50) if ds is not None else None
    ratio = loaded / consumed
    doc = {"loader_samples_s": loaded, "executor_samples_s": consumed, "ratio": ratio, "target": 10.0, **shape,
           "datasets_loader_samples_s": from_ds, "datasets_ratio": None if from_ds is None else from_ds / consumed}
    print(f"loader   {loaded:12,.0f} samples/s (BatchSource.train on a memory-mapped token file)")
    if from_ds is not None:
        print(f"datasets {from_ds:12,.0f} samples/s (the same tokens as a datasets folder, 4 Arrow shards): "
              f"ratio {from_ds / consumed:.1f}x")
    print(f"executor {consumed:12,.0f} samples/s (hetauto run on cpu-demo, global batch {shape['global_batch']}, "
          f"seq {shape['seq_len']})")
    print(f"ratio {ratio:.1f}x (target >= 10x)")
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
