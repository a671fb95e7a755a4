"""The cost model against measured training iteration times of real GPU runs, priced from measured per-layer
profiles of the same hardware: Sailor's (SOSP'25, github.com/eth-easl/sailor, MIT) OPT-350 runs on Clariden
(CSCS; GH200 96GB, 4 per node) and its per-layer GH200 profile. Nothing is fitted to them.

    python benchmarks/fidelity_measured.py [--precision fp32|tf32|bf16|fp16] [--dp-overlap] [--json] [--write-csv]

Data (benchmarks/data/sailor/, README.md there names the source files and commit):
- `opt350_clariden_runs.yaml`: 15 plans Sailor ran (1 to 32 nodes, tp 4, pp 1/2/4, dp 1..32, microbatch 1..8,
  global batch 1..1024), each with its measured seconds per iteration;
- `opt350_gh96_profile.json`: Sailor's measured per-layer forward / backward / update seconds for OPT-350 on GH-96
  at microbatch 1..128 and tp 1, 2, 4 (Sailor's validation prices these runs from it);
- `peer_simulated.yaml`: what Sailor's simulator and its Metis, Piper, Varuna and FlashFlex re-implementations
  predict for the same runs (their code run here as Sailor's own validation script runs it; printed side by side).

`sailor_profile_to_rows` turns the profile into hetauto layer rows (`hetauto profile import --from csv` format):
per (microbatch, tp) one embedding row (layer 0), one block row (the mean of layers 1..24; they differ by < 4%),
one head row (layer 25), seconds -> ms; the update time is dropped (hetauto prices the optimizer step itself),
memory left empty (the profile has none). What the files do not say, assumed: seq_len 2048 (Sailor's
training_config_opt_350.json) and the precision (`--precision`, default fp32: Sailor's validate.py simulates these
runs with fp16=False and its launch script, ae_scripts/clariden_scripts/run_opt.slurm, passes neither --fp16 nor
--bf16; the profile's block forward, 69 GFLOP in 1.40 ms at microbatch 1, tp 1, is 49 TFLOP/s, which
is 73% of GH200's fp32 peak but 5% of bf16's, so the runs may have used TF32 matmuls: the precision is the largest
uncertainty of this comparison and the script prints what each choice gives).

Each run becomes a one-cluster hetauto plan (N nodes of 4 `gh200`, stage i on devices [i*tp*dp, (i+1)*tp*dp),
Sailor's layer slots as they are, microbatch_size = Sailor's mbs x dp, 1F1B), priced twice by the Evaluator
without correction: datasheet-only (the catalog's gh200), and with the measured rows (the gh200 profile with the
converted rows, `hetauto.interop.layer_csv`). Per run: predicted vs measured seconds per iteration and the
critical stage's breakdown; over the runs MAPE = mean |pred - meas| / meas and Spearman (fidelity_published's).

Priced as the runs ran, from run_opt.slurm (Megatron-DeepSpeed's pretrain_gpt.py under DeepSpeed): `"zero_optimization":
{}` is ZeRO stage 0, whose gradient all-reduce runs after the last backward (DeepSpeed's PipelineEngine ReduceGrads
instruction, the engine's allreduce_gradients at the accumulation boundary), not overlapped with it as hetauto's
executor does: the Evaluator's `dp_overlap=False` (`--dp-overlap` prices them as hetauto would run them); no
--use-flash-attn: eager attention (`flash_attention=False`). Memory: each run's measured `max_mem` next to hetauto's
peak per device, as run (eager) and with flash attention; what the runs' memory counter counts (allocated, reserved,
the CUDA context) is not recorded, so memory is a report, not a target.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_published import mape, spearman  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "sailor"
RUNS = DATA / "opt350_clariden_runs.yaml"
PROFILE = DATA / "opt350_gh96_profile.json"
PEERS = DATA / "peer_simulated.yaml"
CSV_OUT = DATA / "opt350_gh96_layers.csv"
DEVICE = "gh200"
MODEL = "opt-350m"
SEQ_LEN = 2048
DEVICES_PER_NODE = 4
COLUMNS = ("device", "kind", "tp", "microbatch", "seq_len", "precision", "fwd_ms", "bwd_ms", "mem_mb", "model")


def sailor_profile_to_rows(profile: dict[str, Any], precision: str, seq_len: int = SEQ_LEN,
                           device: str = DEVICE, model: str = MODEL) -> list[dict[str, Any]]:
    """Sailor's {mbs: {tp: {layer: [fwd_s, bwd_s, update_s]}}} (layer 0 embedding, 1..n-2 blocks, n-1 head) as
    hetauto CSV rows, ms, sorted by (tp, microbatch, kind)."""
    rows = []
    for mbs, per_tp in profile.items():
        for tp, layers in per_tp.items():
            idx = sorted(int(k) for k in layers)
            if idx != list(range(len(idx))) or len(idx) < 3:
                raise ValueError(f"mbs {mbs} tp {tp}: layers {idx} are not 0..n-1")
            blocks = [layers[str(i)] for i in idx[1:-1]]
            parts = {"embedding": layers["0"][:2],
                     "block": [sum(b[0] for b in blocks) / len(blocks), sum(b[1] for b in blocks) / len(blocks)],
                     "head": layers[str(idx[-1])][:2]}
            for kind, (f, b) in parts.items():
                rows.append({"device": device, "kind": kind, "tp": int(tp), "microbatch": int(mbs), "seq_len": seq_len,
                             "precision": precision, "fwd_ms": round(f * 1e3, 6), "bwd_ms": round(b * 1e3, 6),
                             "mem_mb": "", "model": model})
    order = {"embedding": 0, "block": 1, "head": 2}
    return sorted(rows, key=lambda r: (r["tp"], r["microbatch"], order[r["kind"]]))


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def load_runs(path: Path = RUNS) -> list[dict[str, Any]]:
    import yaml

    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if doc.get("schema") != "hetauto.sailor-runs/1":
        raise ValueError(f"{path}: expected schema hetauto.sailor-runs/1")
    return doc["runs"]


def measured_profile(csv_path: Path, out: Path) -> Path:
    """`hetauto profile import --from csv` of the rows onto the gh200 catalog entry; the written profile's path."""
    subprocess.run([sys.executable, "-m", "hetauto.cli", "profile", "import", "--from", "csv", str(csv_path),
                    "--device", DEVICE, "-o", str(out)], check=True, capture_output=True, text=True)
    return out


def training_of(precision: str) -> dict[str, Any]:
    """The plan's `training` for a `--precision` choice: "tf32" is fp32 with TF32 matmuls allowed."""
    return {"precision": "fp32", "allow_tf32": True} if precision == "tf32" else {"precision": precision}


def build_plan(run: dict[str, Any], folder: Path, device: str, precision: str):
    """The run as a hetauto plan in `folder` (cluster.yaml, plan.json), validated as `hetauto run` does."""
    import yaml

    from hetauto.core.plan import Plan
    from hetauto.core.plan_check import validate_plan
    from hetauto.planner.evaluate import resolve_plan_paths
    from hetauto.planner.inputs import load_planning_inputs

    folder.mkdir(parents=True, exist_ok=True)
    cluster = {"name": run["name"], "clusters": [{"name": "c0", "nodes": {
        "count": run["nodes"], "devices_per_node": DEVICES_PER_NODE, "device": device}}]}
    (folder / "cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False), encoding="utf-8")
    dps = {s["dp"] for s in run["stages"]}
    if len(dps) != 1:
        raise ValueError(f"{run['name']}: stages with different dp {sorted(dps)}")
    dp = dps.pop()
    mb = run["mbs"] * dp
    if run["gbs"] % mb:
        raise ValueError(f"{run['name']}: gbs {run['gbs']} is not a multiple of mbs x dp = {mb}")
    stages, first = [], 0
    for s in run["stages"]:
        n = s["tp"] * s["dp"]
        stages.append({"cluster": "c0", "device_type": DEVICE, "devices": list(range(first, first + n)),
                       "layers": list(s["layers"]), "tp": s["tp"], "dp": s["dp"], "recompute": False})
        first += n
    doc = {"schema": "hetauto.plan/1", "model": MODEL, "cluster": "cluster.yaml", "seq_len": SEQ_LEN,
           "global_batch": run["gbs"], "microbatch_size": mb, "num_microbatches": run["gbs"] // mb,
           "stages": stages, "schedule": {"name": "1f1b"}, "training": training_of(precision)}
    plan = Plan.model_validate(doc)
    plan.save(folder / "plan.json")
    spec, cfg = validate_plan(resolve_plan_paths(Plan.load(folder / "plan.json"), folder), base_dir=folder)
    inputs = load_planning_inputs(cluster=spec, model=cfg, global_batch=plan.global_batch, seq_len=plan.seq_len)
    return plan, inputs


def load_peers(path: Path = PEERS) -> dict[str, dict[str, float]]:
    """{run name: {simulator: predicted seconds}} of `peer_simulated.yaml`."""
    import yaml

    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if doc.get("schema") != "hetauto.peer-simulated/1":
        raise ValueError(f"{path}: expected schema hetauto.peer-simulated/1")
    return doc["runs"]


def predict(run: dict[str, Any], folder: Path, device: str, precision: str, dp_overlap: bool = False) -> dict[str, Any]:
    """One run priced by the Evaluator (no correction), as the run ran: eager attention, the gradient all-reduce
    after the backward unless `dp_overlap` (see the module docstring)."""
    from hetauto.planner.evaluate import Evaluator

    try:
        plan, inputs = build_plan(run, folder, device, precision)
        ev = Evaluator(inputs, flash_attention=False, dp_overlap=dp_overlap)
        e = ev.evaluate(plan)
        if not e.feasible:
            return {"ok": False, "why": f"does not fit: {e.violation}"}
        b = ev.breakdown(plan)
        parts = {k[:-2]: v / b.iteration_time_s for k, v in b.as_dict().items()} if b.iteration_time_s > 0 else {}
        # per stage 'm' (measured rows) or 'a' (analytical), the source `hetauto evaluate --json` prints
        flash = Evaluator(inputs, flash_attention=True, dp_overlap=dp_overlap).evaluate(plan)  # memory, for contrast
        return {"ok": True, "iteration_s": e.iteration_time_s, "breakdown": parts,
                "stages": "".join(st.source[0] for st in b.stages), "peak_memory_bytes": max(e.peak_memory_bytes),
                "peak_memory_flash_bytes": max(flash.peak_memory_bytes)}
    except Exception as err:  # noqa: BLE001 - reported, never dropped
        return {"ok": False, "why": f"{type(err).__name__}: {err}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16", "fp16"),
                    help="the precision assumed for the runs and the profile rows (default fp32; tf32: fp32 "
                         "with TF32 matmuls allowed)")
    ap.add_argument("--dp-overlap", action="store_true",
                    help="price the gradient all-reduce overlapped with the backward (hetauto's executor), not after "
                         "it (how these DeepSpeed ZeRO-0 runs did it)")
    ap.add_argument("--json", action="store_true", help="print one JSON document (the last line)")
    ap.add_argument("--write-csv", action="store_true", help=f"(re)write {CSV_OUT.relative_to(DATA.parent.parent)}")
    args = ap.parse_args(argv)
    profile = json.loads(PROFILE.read_text(encoding="utf-8"))
    rows = sailor_profile_to_rows(profile, "fp32" if args.precision == "tf32" else args.precision)
    text = rows_to_csv(rows)
    if args.write_csv:
        CSV_OUT.write_text(text, encoding="utf-8")
    runs = load_runs()
    peers = load_peers()
    results = []
    with tempfile.TemporaryDirectory(prefix="hetauto-sailor-") as tmp:
        root = Path(tmp)
        (root / "layers.csv").write_text(text, encoding="utf-8")
        prof = measured_profile(root / "layers.csv", root / "gh200-measured.yaml")
        for run in runs:
            ds = predict(run, root / "ds" / run["name"], DEVICE, args.precision, args.dp_overlap)
            ms = predict(run, root / "ms" / run["name"], str(prof), args.precision, args.dp_overlap)
            results.append({"name": run["name"], "nodes": run["nodes"], "gpus": DEVICES_PER_NODE * run["nodes"],
                            "parallel": f"{run['stages'][0]['tp']}/{len(run['stages'])}/{run['stages'][0]['dp']}",
                            "mbs": run["mbs"], "gbs": run["gbs"], "measured_s": run["measured_iteration_s"],
                            "measured_max_mem_bytes": run.get("measured_max_mem_bytes"),
                            "datasheet": ds, "measured_rows": ms, "peers": peers.get(run["name"], {})})
    summary, memory = summarise(results)
    if args.json:
        print(json.dumps({"precision": args.precision, "dp_overlap": args.dp_overlap, "runs": results,
                          "summary": summary, "memory": memory}, default=str))
        return 0
    report(results, summary, memory, args.precision, args.dp_overlap)
    return 0


def _fit(meas: list[float], pred: list[float]) -> dict[str, float]:
    return {"runs": len(meas), "mape": mape(meas, pred), "spearman": spearman(meas, pred),
            "signed_mean": sum(q / p - 1 for p, q in zip(meas, pred)) / len(meas) if meas else math.nan}


def summarise(results: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """({datasheet, measured_rows, peer:NAME: MAPE, Spearman, signed mean}, memory MAPEs or None)."""
    summary = {}
    for which in ("datasheet", "measured_rows"):
        got = [r for r in results if r[which]["ok"]]
        summary[which] = _fit([r["measured_s"] for r in got], [r[which]["iteration_s"] for r in got])
    for sim in sorted({k for r in results for k in r["peers"]}, key=lambda k: (k != "sailor", k)):
        got = [r for r in results if sim in r["peers"]]
        summary[f"peer:{sim}"] = _fit([r["measured_s"] for r in got], [r["peers"][sim] for r in got])
    mem = [(r["measured_max_mem_bytes"], r["measured_rows"]) for r in results
           if r["measured_rows"]["ok"] and r.get("measured_max_mem_bytes")]
    if not mem:
        return summary, None
    meas = [m for m, _ in mem]
    return summary, {"runs": len(mem), "mape_as_run": mape(meas, [p["peak_memory_bytes"] for _, p in mem]),
                     "mape_flash": mape(meas, [p["peak_memory_flash_bytes"] for _, p in mem])}


def _err(pred: float, meas: float) -> str:
    return f"{100 * (pred / meas - 1):+5.0f}%"


def report(results: list[dict[str, Any]], summary: dict[str, Any], memory: dict[str, Any] | None, precision: str,
           dp_overlap: bool) -> None:
    w = sys.stdout.write
    how = "overlapped with the backward" if dp_overlap else "after the backward (as run)"
    w(f"OPT-350 on Clariden GH200, precision assumed {precision}, gradient all-reduce {how}; seconds per iteration\n")
    head = (f"{'run':14} {'GPUs':>4} {'tp/pp/dp':>8} {'mbs':>3} {'gbs':>5} | {'measured':>8} | {'datasheet':>9} "
            f"{'err':>6} | {'meas.rows':>9} {'err':>6} {'stages':>6} | {'sailor':>6} {'err':>6}")
    w(head + "\n" + "-" * len(head) + "\n")
    for r in results:
        meas = r["measured_s"]
        line = f"{r['name']:14} {r['gpus']:>4} {r['parallel']:>8} {r['mbs']:>3} {r['gbs']:>5} | {meas:8.3f} |"
        for which in ("datasheet", "measured_rows"):
            p = r[which]
            line += f" {p['iteration_s']:9.3f} {_err(p['iteration_s'], meas)}" if p["ok"] else f" {p['why'][:40]}"
            line += " |" if which == "datasheet" else ""
        line += f" {r['measured_rows'].get('stages', ''):>6} |"
        sim = r["peers"].get("sailor")
        line += f" {sim:6.3f} {_err(sim, meas)}" if sim is not None else ""
        w(line + "\n")
    w("\nwhere the predicted time goes (critical stage, share of the iteration):\n")
    for r in results:
        for which in ("datasheet", "measured_rows"):
            p = r[which]
            if p["ok"]:
                parts = ", ".join(f"{k} {100 * v:.0f}%" for k, v in p["breakdown"].items() if v >= 0.005)
                w(f"  {r['name']:14} {which:13} {p['iteration_s']:7.3f} s: {parts}\n")
    w("\nmemory per device, GiB: measured max_mem (Sailor's memory log; what it counts -- allocated, reserved or "
      "the CUDA context too -- is not recorded) vs hetauto's peak (measured rows' plan; the rows carry no memory) "
      "as run (eager attention: score matrices kept) and with flash attention:\n")
    for r in results:
        p, m = r["measured_rows"], r.get("measured_max_mem_bytes")
        if p["ok"] and m:
            e, f = p["peak_memory_bytes"], p["peak_memory_flash_bytes"]
            w(f"  {r['name']:14} mbs {r['mbs']}: measured {m / 2**30:5.1f} | eager {e / 2**30:5.1f} ({_err(e, m)})"
              f" | flash {f / 2**30:5.1f} ({_err(f, m)})\n")
    if memory:
        w(f"  MAPE: as run (eager) {100 * memory['mape_as_run']:.0f}%, flash {100 * memory['mape_flash']:.0f}% "
          f"over {memory['runs']} runs\n")
    w("\niteration time over the runs (peer: its own simulator, peer_simulated.yaml):\n")
    for which, x in summary.items():
        w(f"{which:16} runs {x['runs']:>2}  MAPE {100 * x['mape']:.1f}%  signed mean {100 * x['signed_mean']:+.1f}%  "
          f"Spearman {x['spearman']:.3f}\n")

if __name__ == "__main__":
    raise SystemExit(main())
