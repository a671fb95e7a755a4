"""How close is the cost model to training runs anyone can check? Published, measured throughputs, each row with its
citation, expressed as hetauto plans and priced by the Evaluator; nothing is fitted to them.

    python benchmarks/fidelity_published.py [--rows NAME,...] [--json] [--write-plans DIR] [--no-correction]

The table is `benchmarks/data/published_runs.yaml`: the Megatron-LM SC'21 paper's Table 1 (GPT 1.7B ... 1T on
A100, configurations from the repository's own `examples/sc21/run_table_1.sh`), torchtitan's `docs/performance.md`
(Llama 3 / 3.1 8B and 70B on A100 and H100, FSDP) and the Llama 3 paper's Table 4 (405B on 8,192 and 16,384 H100).
Each row becomes, in a temporary folder (or --write-plans DIR, one sub-folder per row, so that
`hetauto evaluate DIR/ROW/plan.json` prices the same thing): a one-cluster spec (`gpus / 8` nodes of 8 of the
row's catalog device, links from its profile), the model (a catalog name or the row's Hugging Face config.json)
and a `hetauto.plan/1` plan (pp equal stages of blocks, the embedding on the first and the head on the last,
each stage tp x dp contiguous devices, microbatch_size = the source's per-replica microbatch x dp), validated
with `hetauto.core.plan_check.validate_plan` as `hetauto run` does.

Compared per GPU, published vs predicted:
- tokens/s per GPU: torchtitan publishes it; for Megatron and Llama 3, which publish TFLOP/s per GPU, it is that
  figure over the source's own FLOPs per token (`flops_conventions` in the table). Megatron counts the
  recomputation's extra forward in its TFLOP/s (Eq. 3: 96*l*h^2*(1 + s/6h + V/16lh) per token, 4 passes), so a
  published 137 TFLOP/s at 1.7B is 137e12 / 1.475e10 = 9,288 tokens/s per GPU; the Llama 3 paper's and
  torchtitan's figures are model FLOPs (6N + 12*l*heads*head_dim*s, no recomputation).
- TFLOP/s per GPU in the source's convention: the prediction's tokens/s times the same FLOPs per token, so the
  error is the tokens/s error; `hetauto MFU` is hetauto's own (its FLOP count, no recomputation, its peak).
A row hetauto says does not fit shows the violation instead of a prediction and is left out of the statistics; so
is a row whose plan hetauto refuses (the error is shown). MAPE = mean |pred - pub| / pub; Spearman = Pearson of
the average ranks (ties share their mean rank), over the rows with a prediction, for tokens/s and TFLOP/s per GPU.

Two predictions: datasheet-only (`Evaluator(inputs)`, no correction, no calibration: the catalog's peak x its
efficiency curve, the analytical TP/DP/P2P terms) and with the Evaluator's default correction
(`correction="default"`, the shipped forest, which applies only to devices inside its measured speed range: the
`covered` column says for how many of a row's stages it did). Per row the time breakdown of the critical stage
(compute, TP, exposed DP all-reduce, P2P, bubble, optimizer; `Evaluator.breakdown`) says where the time goes.

The last line with --json is one JSON document: {"rows": [...], "summary": {...}}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent / "data" / "published_runs.yaml"
TABLE_SCHEMA = "hetauto.published-runs/1"
DEVICES_PER_NODE = 8
REQUIRED = ("name", "source", "citation", "device", "gpus", "model", "seq_len", "tp", "pp", "dp", "microbatch",
            "global_batch", "precision", "recompute", "published")
KNOWN = set(REQUIRED) | {"schedule", "chunks", "stage_split", "zero1", "dp_sharding", "reshard_after_forward",
                         "flash_attention", "sequence_parallel", "approximate"}
PUBLISHED_KEYS = {"tokens_per_s_per_gpu", "tflops_per_gpu", "percent_of_peak", "mfu_percent", "flops"}


# ------------------------------------------------------------------------------------------------ statistics
def mape(published: list[float], predicted: list[float]) -> float:
    """Mean absolute percentage error, as a fraction: mean |pred - pub| / pub (nan for no rows)."""
    if len(published) != len(predicted):
        raise ValueError("published and predicted differ in length")
    if not published:
        return math.nan
    return sum(abs(q - p) / p for p, q in zip(published, predicted)) / len(published)


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given the mean of the ranks they span (scipy's rankdata; scipy comes with scikit-learn)."""
    from scipy.stats import rankdata

    return [float(r) for r in rankdata(values)]


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the average ranks (nan under 2 rows or a constant side)."""
    if len(a) != len(b):
        raise ValueError("the two lists differ in length")
    if len(a) < 2:
        return math.nan
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return math.nan
    return cov / math.sqrt(va * vb)


# ------------------------------------------------------------------------------------------------ the table
def load_table(path: str | Path = TABLE) -> dict[str, Any]:
    """The table, checked: every row names a known source, has a citation (where + quote), the required plan
    fields, and a published figure in a known FLOP convention. Raises ValueError naming the row and field."""
    import yaml

    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("schema") != TABLE_SCHEMA:
        raise ValueError(f"{path}: expected schema {TABLE_SCHEMA!r}")
    sources, conventions = doc.get("sources") or {}, doc.get("flops_conventions") or {}
    seen: set[str] = set()
    for i, row in enumerate(doc.get("rows") or []):
        name = row.get("name", f"rows[{i}]")
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"row {name}: missing {', '.join(missing)}")
        extra = sorted(set(row) - KNOWN)
        if extra:
            raise ValueError(f"row {name}: unknown field(s) {', '.join(extra)}")
        if name in seen:
            raise ValueError(f"row {name}: duplicate name")
        seen.add(name)
        if row["source"] not in sources:
            raise ValueError(f"row {name}: unknown source {row['source']!r}")
        cit = row["citation"]
        if not isinstance(cit, dict) or not cit.get("where") or not cit.get("quote"):
            raise ValueError(f"row {name}: citation needs 'where' and a verbatim 'quote'")
        pub = row["published"]
        if set(pub) - PUBLISHED_KEYS or not ({"tokens_per_s_per_gpu", "tflops_per_gpu"} & set(pub)):
            raise ValueError(f"row {name}: published needs tokens_per_s_per_gpu or tflops_per_gpu (and only {sorted(PUBLISHED_KEYS)})")
        if pub.get("flops") not in conventions:
            raise ValueError(f"row {name}: published.flops {pub.get('flops')!r} is not one of {sorted(conventions)}")
        if row["gpus"] != row["tp"] * row["pp"] * row["dp"]:
            raise ValueError(f"row {name}: gpus {row['gpus']} != tp*pp*dp = {row['tp'] * row['pp'] * row['dp']}")
    if not seen:
        raise ValueError(f"{path}: no rows")
    return doc


def select_rows(doc: dict[str, Any], names: str | None) -> list[dict[str, Any]]:
    rows = doc["rows"]
    if not names:
        return list(rows)
    want = [n.strip() for n in names.split(",") if n.strip()]
    known = {r["name"]: r for r in rows}
    unknown = [n for n in want if n not in known]
    if unknown:
        raise SystemExit(f"unknown row(s): {', '.join(unknown)}; rows: {', '.join(known)}")
    return [known[n] for n in want]


def flops_per_token(convention: str, model: Any, seq_len: int) -> float:
    """FLOPs per token in a source's own convention (the table's `flops_conventions`)."""
    from hetauto.planner.layers import total_params

    l, h, s = model.num_layers, model.hidden, seq_len
    if convention == "megatron-eq3":
        v = model.vocab_size
        return 96.0 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    attn = 12.0 * l * model.num_heads * model.head_dim * s
    if convention in ("torchtitan-2024-04", "palm-mfu"):
        return 6.0 * total_params(model) + attn
    if convention == "torchtitan-2024-12":  # get_num_params(exclude_embedding=True): less tok_embeddings only
        return 6.0 * (total_params(model) - model.vocab_size * model.hidden) + attn
    raise ValueError(f"unknown FLOP convention {convention!r}")


# ------------------------------------------------------------------------------------------------ plans
@dataclass
class RowSetup:
    row: dict[str, Any]
    folder: Path
    plan: Any  # hetauto.core.plan.Plan, paths relative to `folder`
    inputs: Any  # PlanningInputs
    options: dict[str, Any]  # Evaluator keyword options the source ran with


def stage_layers(num_blocks: int, pp: int, split: str = "blocks") -> list[tuple[int, int]]:
    """pp stages over the slots [embedding, blocks, head]: "blocks" (Megatron) gives every stage the same number of
    blocks (the remainder to the first stages), the embedding and the head on top; "slots" (Llama 3: "we reduce one
    Transformer layer each from the first and the last stages") gives every stage the same number of slots."""
    if split == "slots":
        base, extra = divmod(num_blocks + 2, pp)
        bounds = [0]
        for i in range(pp):
            bounds.append(bounds[-1] + base + (1 if i < extra else 0))
        return list(zip(bounds[:-1], bounds[1:]))
    if split != "blocks":
        raise ValueError(f"stage_split must be 'blocks' or 'slots', not {split!r}")
    base, extra = divmod(num_blocks, pp)
    out, start = [], 0
    for i in range(pp):
        n = base + (1 if i < extra else 0)
        end = start + n + (1 if i == 0 else 0) + (1 if i == pp - 1 else 0)
        out.append((start, end))
        start = end
    return out


def megatron_chunks(num_blocks: int, pp: int, v: int) -> list[list[tuple[int, int]]]:
    """Per stage, its v chunk ranges as Megatron lays out an interleaved model: virtual stage k = c * pp + r (chunk c
    of stage r) holds blocks [k * b, (k + 1) * b), b = num_blocks / (pp * v), the embedding with virtual stage 0 and
    the head with the last (in slots: block i is slot i + 1)."""
    if num_blocks % (pp * v):
        raise ValueError(f"{num_blocks} blocks do not split into {pp} stages x {v} chunks")
    b, last = num_blocks // (pp * v), pp * v - 1
    return [[((0 if k == 0 else k * b + 1), ((k + 1) * b + 1) + (1 if k == last else 0))
             for k in (c * pp + r for c in range(v))] for r in range(pp)]


def build_row(row: dict[str, Any], root: Path) -> RowSetup:
    """Write the row's cluster.yaml, config.json (hf_config rows) and plan.json under root/NAME and return them
    loaded and validated (`validate_plan`, as hetauto run / evaluate check a plan file)."""
    import yaml

    from hetauto.core.plan import Plan
    from hetauto.core.plan_check import validate_plan
    from hetauto.planner.evaluate import resolve_plan_paths
    from hetauto.planner.inputs import load_planning_inputs

    folder = root / row["name"]
    folder.mkdir(parents=True, exist_ok=True)
    gpus, tp, pp, dp = row["gpus"], row["tp"], row["pp"], row["dp"]
    nodes = max(1, math.ceil(gpus / DEVICES_PER_NODE))
    per_node = DEVICES_PER_NODE if gpus >= DEVICES_PER_NODE else gpus
    cluster = {"name": row["name"], "clusters": [{"name": "c0", "nodes": {"count": nodes, "devices_per_node": per_node,
                                                                           "device": row["device"]}}]}
    (folder / "cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False), encoding="utf-8")
    model_ref = row["model"]
    if isinstance(model_ref, dict):
        (folder / "config.json").write_text(json.dumps(model_ref["hf_config"], indent=1) + "\n", encoding="utf-8")
        model_ref = "config.json"
    from hetauto.core.model_catalog import get_model

    model = get_model(folder / model_ref if model_ref == "config.json" else model_ref)
    mb = row["microbatch"] * dp
    if row["global_batch"] % mb:
        raise ValueError(f"row {row['name']}: global batch {row['global_batch']} is not a multiple of microbatch x dp = {mb}")
    schedule = row.get("schedule") or {"name": "1f1b"}
    chunks = None
    if row.get("chunks") == "megatron":
        chunks = megatron_chunks(model.num_layers, pp, schedule["virtual_chunks"])
    elif row.get("chunks") is not None:
        raise ValueError(f"row {row['name']}: chunks must be 'megatron' or absent (hetauto's default layout)")
    stages = []
    for i, layers in enumerate(stage_layers(model.num_layers, pp, row.get("stage_split", "blocks"))):
        first = i * tp * dp
        st = {"cluster": "c0", "device_type": row["device"], "devices": list(range(first, first + tp * dp)),
              "layers": list(layers), "tp": tp, "dp": dp, "recompute": bool(row["recompute"])}
        if chunks is not None:
            st["chunks"] = [list(c) for c in chunks[i]]
        stages.append(st)
    doc = {"schema": "hetauto.plan/1", "model": model_ref, "cluster": "cluster.yaml", "seq_len": row["seq_len"],
           "global_batch": row["global_batch"], "microbatch_size": mb, "num_microbatches": row["global_batch"] // mb,
           "stages": stages, "schedule": schedule, "zero1": bool(row.get("zero1", False)),
           "training": {"precision": row["precision"]}}
    if "dp_sharding" in row:  # hetauto.core.dp_sharding: zero2 / fsdp (FSDP2, torchtitan, Llama 3)
        doc["dp_sharding"] = row["dp_sharding"]
    if "reshard_after_forward" in row:
        doc["reshard_after_forward"] = bool(row["reshard_after_forward"])
    plan = Plan.model_validate(doc)
    plan.save(folder / "plan.json")
    # as `hetauto evaluate PLAN` reads it: relative paths against the plan's folder, then what `hetauto run` checks
    spec, cfg = validate_plan(resolve_plan_paths(Plan.load(folder / "plan.json"), folder), base_dir=folder)
    inputs = load_planning_inputs(cluster=spec, model=cfg, global_batch=plan.global_batch, seq_len=plan.seq_len)
    options = {k: row[k] for k in ("flash_attention", "sequence_parallel") if k in row}
    return RowSetup(row, folder, plan, inputs, options)


# ------------------------------------------------------------------------------------------------ evaluation
@dataclass
class Prediction:
    feasible: bool
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None  # in the source's convention
    hetauto_mfu: float | None = None
    iteration_s: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    violation: str | None = None
    covered: str | None = None  # stages the correction applied to, "k/n"
    memory: dict[str, float] = field(default_factory=dict)  # a plan that does not fit: its failing stage's terms, GiB


@dataclass
class RowResult:
    name: str
    source: str
    device: str
    gpus: int
    parallel: str
    published_tokens: float
    published_tflops: float
    approximate: str | None
    citation: dict[str, Any]
    datasheet: Prediction
    corrected: Prediction | None = None
    error: str | None = None  # the plan could not be built or priced

    def to_json(self) -> dict[str, Any]:
        def pred(p: Prediction | None) -> dict[str, Any] | None:
            return None if p is None else {k: v for k, v in p.__dict__.items()}

        return {"name": self.name, "source": self.source, "device": self.device, "gpus": self.gpus,
                "parallel": self.parallel, "published_tokens_per_s_per_gpu": self.published_tokens,
                "published_tflops_per_gpu": self.published_tflops, "approximate": self.approximate,
                "citation": self.citation, "datasheet": pred(self.datasheet), "corrected": pred(self.corrected),
                "error": self.error}


def memory_terms(ev: Any, plan: Any, stage: int = 0) -> dict[str, float]:
    """A stage's memory in GiB, apart: `static` (model states, workspace, a re-materialised block), `per_microbatch`
    (kept per in-flight microbatch), `weight_casts` (of which the 16-bit weight copies autocast saves per in-flight
    microbatch: hetauto prices its executor's fp32 master weights under autocast; none under FSDP, which casts at
    its all-gather), `inflight`, `total`."""
    from hetauto.core.precision import compute_bytes

    st, prec = plan.stages[stage], ev.precision(plan)
    def at(inflight: float) -> float:
        return ev.stage_memory_bytes(st.cluster, st.layers, st.tp, st.dp, plan.microbatch_size, inflight,
                                     st.recompute, plan.dp_level, prec)
    sums = ev.layer_table(prec).range(*st.layers)
    nbytes = compute_bytes(prec)
    casts = (sums.nonblock_matmul if st.recompute else sums.matmul_params) / st.tp * (nbytes if nbytes < 4 else 0)
    if plan.dp_level in ("fsdp", "fsdp-keep") and st.dp > 1:
        casts = 0.0
    inflight = ev.inflight(plan, stage)
    gib = float(1 << 30)
    return {"stage": stage, "static": at(0) / gib, "per_microbatch": (at(1) - at(0)) / gib, "weight_casts": casts / gib,
            "inflight": inflight, "total": at(inflight) / gib}


def _predict(setup: RowSetup, fpt: float, correction: Any) -> Prediction:
    from hetauto.planner.evaluate import Evaluator

    ev = Evaluator(setup.inputs, correction=correction, **setup.options)
    plan = setup.plan
    e = ev.evaluate(plan)
    covered = None
    if ev.correction is not None:
        prec = ev.precision(plan)
        hits = 0
        for st in plan.stages:
            d = ev.stage_detail(st.cluster, st.layers, st.tp, st.dp, plan.microbatch_size, st.recompute, prec)
            feats = ev.correction.features_for(ev.cluster(st.cluster), ev.inputs, st.layers, st.tp, st.dp,
                                               plan.microbatch_size, st.recompute, d)
            hits += bool(ev.correction.covers(feats))
        covered = f"{hits}/{len(plan.stages)}"
    elif correction is not None:
        covered = "untrained"
    if not e.feasible:
        failing = next((i for i, (need, cap) in enumerate(zip(e.peak_memory_bytes, e.memory_capacity_bytes))
                        if need > cap), 0)  # the stage the violation names
        return Prediction(False, violation=e.violation, covered=covered, memory=memory_terms(ev, plan, failing))
    tok = e.tokens_s / plan.world_size
    b = ev.breakdown(plan)
    parts = b.as_dict()
    shares = {k[:-2]: v / b.iteration_time_s for k, v in parts.items()} if b.iteration_time_s > 0 else {}
    return Prediction(True, tok, tok * fpt / 1e12, e.mfu, e.iteration_time_s, shares, None, covered)


def evaluate_row(row: dict[str, Any], root: Path, correction: Any = "default") -> RowResult:
    """Build the row's plan and price it datasheet-only and (correction not None) with `correction`."""
    pub = row["published"]
    parallel = f"{row['tp']}/{row['pp']}/{row['dp']}"
    base = dict(name=row["name"], source=row["source"], device=row["device"], gpus=row["gpus"], parallel=parallel,
                approximate=(str(row["approximate"]).strip() if row.get("approximate") else None),
                citation=row["citation"])
    try:
        setup = build_row(row, root)
        fpt = flops_per_token(pub["flops"], setup.inputs.model, row["seq_len"])
    except Exception as err:  # noqa: BLE001 - reported in the table, never dropped
        tok = float(pub.get("tokens_per_s_per_gpu") or math.nan)
        tfl = float(pub.get("tflops_per_gpu") or math.nan)
        return RowResult(published_tokens=tok, published_tflops=tfl, datasheet=Prediction(False),
                         error=f"{type(err).__name__}: {err}", **base)
    tok = float(pub["tokens_per_s_per_gpu"]) if "tokens_per_s_per_gpu" in pub else pub["tflops_per_gpu"] * 1e12 / fpt
    tfl = float(pub["tflops_per_gpu"]) if "tflops_per_gpu" in pub else tok * fpt / 1e12
    res = RowResult(published_tokens=tok, published_tflops=tfl, datasheet=Prediction(False), **base)
    try:
        res.datasheet = _predict(setup, fpt, None)
        if correction is not None:
            res.corrected = _predict(setup, fpt, correction)
    except Exception as err:  # noqa: BLE001
        res.error = f"{type(err).__name__}: {err}"
    return res


def summarize(results: list[RowResult], which: str = "datasheet") -> dict[str, Any]:
    """MAPE and Spearman (tokens/s and TFLOP/s per GPU) over the rows `which` predicts; exact rows apart."""
    def stats(rs: list[RowResult]) -> dict[str, Any]:
        got = [(r, getattr(r, which)) for r in rs]
        got = [(r, p) for r, p in got if p is not None and p.feasible and r.error is None]
        pub_t = [r.published_tokens for r, _ in got]
        pred_t = [p.tokens_per_s_per_gpu for _, p in got]
        pub_f = [r.published_tflops for r, _ in got]
        pred_f = [p.tflops_per_gpu for _, p in got]
        return {"rows": len(got), "mape": mape(pub_t, pred_t), "spearman_tokens": spearman(pub_t, pred_t),
                "spearman_tflops": spearman(pub_f, pred_f),
                "signed_mean": (sum(q / p - 1 for p, q in zip(pub_t, pred_t)) / len(got)) if got else math.nan}

    out = {"all": stats(results), "exact": stats([r for r in results if not r.approximate])}
    out["not_fitting"] = [r.name for r in results if r.error is None and getattr(r, which) is not None
                          and not getattr(r, which).feasible]
    out["errors"] = [r.name for r in results if r.error is not None]
    return out


# ------------------------------------------------------------------------------------------------ printing
def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _err(pub: float, pred: float | None) -> str:
    return "-" if pred is None else f"{100 * (pred / pub - 1):+.0f}%"


def print_table(results: list[RowResult], summaries: dict[str, dict[str, Any]], out: Any = sys.stdout) -> None:
    w = out.write
    corrected = any(r.corrected is not None for r in results)
    head = (f"{'row':32} {'GPUs':>6} {'tp/pp/dp':>9} | {'tok/s/GPU pub':>13} {'pred':>8} {'err':>6} | "
            f"{'TFLOP/s pub':>11} {'pred':>6} | {'MFU':>5}")
    if corrected:
        head += f" | {'corr. pred':>10} {'err':>6} {'cov':>5}"
    w(head + "\n" + "-" * len(head) + "\n")
    for r in results:
        d = r.datasheet
        line = (f"{r.name + ('*' if r.approximate else ''):32} {r.gpus:>6} {r.parallel:>9} | "
                f"{_fmt(r.published_tokens, ',.0f'):>13} ")
        if r.error is not None:
            w(line + f"error: {r.error}\n")
            continue
        if not d.feasible:
            w(line + f"does not fit: {d.violation}\n")
            continue
        line += (f"{_fmt(d.tokens_per_s_per_gpu, ',.0f'):>8} {_err(r.published_tokens, d.tokens_per_s_per_gpu):>6} | "
                 f"{_fmt(r.published_tflops, '.0f'):>11} {_fmt(d.tflops_per_gpu, '.0f'):>6} | "
                 f"{_fmt(100 * d.hetauto_mfu, '.0f') + '%':>5}")
        if corrected and r.corrected is not None:
            c = r.corrected
            if c.feasible:
                line += (f" | {_fmt(c.tokens_per_s_per_gpu, ',.0f'):>10} "
                         f"{_err(r.published_tokens, c.tokens_per_s_per_gpu):>6} {c.covered or '-':>5}")
            else:
                line += f" | does not fit ({c.covered})"
        w(line + "\n")
    w("* approximate (the row's `approximate` note says why):\n")
    for r in results:
        if r.approximate:
            w(f"  {r.name}: {' '.join(r.approximate.split())}\n")
    w("\nmemory of the stage of a plan that does not fit (the first that does not; GiB; datasheet-only):\n")
    for r in results:
        m = r.datasheet.memory
        if r.error is None and m:
            w(f"  {r.name:32} stage {m['stage']:g}: static {m['static']:.1f} + {m['inflight']:g} in flight x {m['per_microbatch']:.2f} "
              f"(of which weight casts {m['weight_casts']:.2f}) = {m['total']:.1f}\n")
    w("\nwhere the predicted time goes (critical stage, share of the iteration; datasheet-only):\n")
    for r in results:
        d = r.datasheet
        if r.error is None and d.feasible:
            parts = ", ".join(f"{k} {100 * v:.0f}%" for k, v in d.breakdown.items() if v >= 0.005)
            w(f"  {r.name:32} {d.iteration_s:8.3f} s/iter: {parts}\n")
    w("\n")
    for label, s in summaries.items():
        for part in ("all", "exact"):
            x = s[part]
            w(f"{label + ' (' + part + ' rows)':34} rows {x['rows']:>2}  MAPE {_fmt(100 * x['mape'], '.1f')}%  "
              f"signed mean {_fmt(100 * x['signed_mean'], '+.1f')}%  Spearman tok/s {_fmt(x['spearman_tokens'], '.3f')}  "
              f"TFLOP/s {_fmt(x['spearman_tflops'], '.3f')}\n")
        if s["not_fitting"]:
            w(f"{label}: does not fit (left out): {', '.join(s['not_fitting'])}\n")
        if s["errors"]:
            w(f"{label}: errors (left out): {', '.join(s['errors'])}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", help="comma-separated row names (default: all)")
    ap.add_argument("--json", action="store_true", help="print one JSON document (the last line)")
    ap.add_argument("--table", default=str(TABLE), help="the table (default: benchmarks/data/published_runs.yaml)")
    ap.add_argument("--write-plans", metavar="DIR", help="keep each row's cluster.yaml/config.json/plan.json in DIR/ROW")
    ap.add_argument("--no-correction", action="store_true", help="datasheet-only predictions")
    args = ap.parse_args(argv)
    doc = load_table(args.table)
    rows = select_rows(doc, args.rows)
    correction = None if args.no_correction else "default"
    with tempfile.TemporaryDirectory(prefix="hetauto-fidelity-") as tmp:
        root = Path(args.write_plans) if args.write_plans else Path(tmp)
        results = [evaluate_row(r, root, correction) for r in rows]
    summaries = {"datasheet-only": summarize(results, "datasheet")}
    if correction is not None:
        summaries["default correction"] = summarize(results, "corrected")
    if args.json:
        print(json.dumps({"rows": [r.to_json() for r in results], "summary": summaries}, default=str))
    else:
        print_table(results, summaries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
