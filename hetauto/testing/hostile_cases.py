"""The hostile-input probe's case table (benchmarks/hostile_inputs.py runs it; tests/project/test_hostile_inputs.py requires
every case clean). Why a table: each case is one line a reviewer can read, so adding the next bad input a user
finds is one line too.

Every case folder starts with `base()`'s valid inputs: cluster.yaml (cpu-demo's cluster), plan.json (a cpu-demo
plan whose cluster is the scenario), plan-file.json (the same plan on cluster.yaml), text.txt, tokens.bin (from
`hetauto data prepare`), layers.csv, metis/DeviceType.A100_tp1_bs1.json, ckpt/step-00000001 (a manifest and
files), config.json (a Hugging Face gpt2-style config), adir/ (an empty folder).
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from hetauto.testing.hostile import Case

CLUSTER: dict[str, Any] = {
    "clusters": [
        {"name": "fast", "nodes": {"count": 1, "devices_per_node": 2, "device": "cpu"}, "speed_factor": 1.0},
        {"name": "slow", "nodes": {"count": 1, "devices_per_node": 2, "device": "cpu"}, "speed_factor": 0.5,
         "backend": "mock"},
    ],
    "links": {"default": {"bandwidth": "1Gbps", "latency": "1ms", "shared_capacity": "1Gbps"}},
}

PLAN: dict[str, Any] = {
    "schema": "hetauto.plan/1", "model": "tiny-gpt", "cluster": "cpu-demo", "seq_len": 32, "global_batch": 160,
    "microbatch_size": 32, "num_microbatches": 5,
    "stages": [
        {"cluster": "fast", "device_type": "cpu", "devices": [0], "layers": [0, 3], "tp": 1, "dp": 1},
        {"cluster": "fast", "device_type": "cpu", "devices": [1], "layers": [3, 5], "tp": 1, "dp": 1},
        {"cluster": "slow", "device_type": "cpu", "devices": [0, 1], "layers": [5, 6], "tp": 1, "dp": 2},
    ],
    "schedule": {"name": "1f1b", "virtual_chunks": 1},
    "resharding": ["scatter-allgather", "scatter-allgather"],
    "zero1": False, "memory_headroom": 0.1,
}

LLAMA_CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64}
HF_CONFIG = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64}

METIS = {
    "model": {"model_name": "GPT3", "num_layers": 3,
              "parameters": {"total_parameters_bytes": 3000, "parameters_per_layer_bytes": [1000, 1000, 1000]}},
    "execution_time": {"total_time_ms": 10.0, "forward_backward_time_ms": 8.0, "batch_generator_time_ms": 0.1,
                       "layernorm_grads_all_reduce_time_ms": 0.1, "embedding_grads_all_reduce_time_ms": 0.1,
                       "optimizer_time_ms": 1.0, "layer_compute_total_ms": [0.5, 3.0, 0.5]},
    "execution_memory": {"total_memory": 3000, "layer_memory_total_mb": [1000, 1000, 1000]},
}
METIS_FILE = "metis/DeviceType.A100_tp1_bs1.json"

CSV_HEADER = "device,kind,tp,microbatch,seq_len,precision,fwd_ms,bwd_ms,mem_mb,model\n"
CSV_ROW = "a100-80g,block,1,1,1024,bf16,9.5,19.0,4146,gpt3-1.3b\n"

MODEL = {"name": "tiny-gpt", "arch": "gpt", "num_layers": 4, "hidden": 64, "num_heads": 4, "ffn_hidden": 256,
         "vocab_size": 256, "max_seq_len": 32, "num_kv_heads": None, "tie_embeddings": False, "builder": None,
         "gelu": "exact", "qkv_bias": False, "norm_eps": 1e-05, "rope_theta": 10000.0}
SHARD = b"\x00" * 64
# a checkpoint of no tensors: it verifies (so a case reaches the check after verification) but exports nothing
METADATA = b'{"format": "hetauto.dcp-metadata/1", "tensors": {}, "storage": []}'
RANK = b'{"rank": 0, "rng": {}}'


def manifest(**changes: Any) -> str:
    """A hetauto.checkpoint/1 manifest for ckpt/step-00000001, with `changes` applied (None removes a field)."""
    import hashlib

    doc: dict[str, Any] = {
        "format": "hetauto.checkpoint/1", "step": 1, "model": MODEL, "plan": None, "world_size": 1, "extra": {},
        "hetauto_version": "0", "created_unix": 0.0,
        "files": {"__0_0.distcp": {"bytes": len(SHARD), "sha256": hashlib.sha256(SHARD).hexdigest()},
                  ".metadata.json": {"bytes": len(METADATA), "sha256": hashlib.sha256(METADATA).hexdigest()},
                  "rank-00000.json": {"bytes": len(RANK), "sha256": hashlib.sha256(RANK).hexdigest()}},
    }
    for k, v in changes.items():
        if v is None:
            doc.pop(k, None)
        else:
            doc[k] = v
    if "digest" not in changes:  # sealed like hetauto's own (Manifest.fields_digest): verification requires it
        canonical = json.dumps({k: v for k, v in doc.items() if k != "digest"}, sort_keys=True, separators=(",", ":"))
        doc["digest"] = hashlib.sha256(canonical.encode()).hexdigest()
    return json.dumps(doc)


def yaml_doc(doc: Any) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)


def cluster(edit: Any) -> str:
    """cluster.yaml's text after `edit(doc)` changed a deep copy of the valid cluster."""
    doc = copy.deepcopy(CLUSTER)
    edit(doc)
    return yaml_doc(doc)


def node0(**changes: Any) -> str:
    """The valid cluster with its first cluster's `nodes` changed."""
    return cluster(lambda d: d["clusters"][0]["nodes"].update(changes))


def plan(edit: Any) -> str:
    """plan.json's text after `edit(doc)` changed a deep copy of the valid plan."""
    doc = copy.deepcopy(PLAN)
    edit(doc)
    return json.dumps(doc)


def plan_set(**changes: Any) -> str:
    return plan(lambda d: d.update(changes))


def stage0(**changes: Any) -> str:
    return plan(lambda d: d["stages"][0].update(changes))


@functools.cache
def _base_files() -> tuple[tuple[str, str | bytes], ...]:
    """The valid inputs' paths and contents, built once: every one of the 600+ cases writes them again."""
    file_plan = copy.deepcopy(PLAN) | {"cluster": "cluster.yaml"}
    files: dict[str, str | bytes] = {  # ckpt/: a checkpoint that verifies (manifest, metadata, rank file, shard)
        "cluster.yaml": yaml_doc(CLUSTER), "plan.json": json.dumps(PLAN, indent=2),
        "plan-file.json": json.dumps(file_plan, indent=2), "text.txt": "hello hostile world\n" * 20,
        "layers.csv": CSV_HEADER + CSV_ROW, METIS_FILE: json.dumps(METIS), "config.json": json.dumps(HF_CONFIG),
        "ckpt/step-00000001/manifest.json": manifest(), "ckpt/step-00000001/__0_0.distcp": SHARD,
        "ckpt/step-00000001/.metadata.json": METADATA, "ckpt/step-00000001/rank-00000.json": RANK,
        "tokens.bin": bytes(range(256)) * 8,
    }
    return tuple(files.items())


def base(folder: Path) -> None:
    """The valid inputs every case folder starts with (see the module docstring)."""
    for rel, content in _base_files():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    (folder / "adir").mkdir()


def _prepared_tokens(folder: Path) -> None:
    from hetauto.cli import main

    main(["data", "prepare", "text.txt", "-o", "prepared.bin"])


def _launch_dir(folder: Path) -> None:
    from hetauto.cli import main

    main(["launch", "plan.json", "--master", "127.0.0.1", "-o", "L"])


# A plan search cut to a handful of evaluations, for cases whose input is valid: they still go through the whole
# command (the search, its printing, the islands hint), in ~0.1 s instead of the ~0.8 s of `--iterations 2`.
QUICK_SEARCH = ("--iterations", "1", "--max-evaluations", "5")
BINARY = bytes(range(256)) * 4
DEEP = "[" * 100_000 + "]" * 100_000


def _cli(command: str, name: str, *argv: str, **kw: Any) -> Case:
    """A CLI case: `hetauto COMMAND ARGV...` (the command word is added unless argv starts with it)."""
    if command != "hetauto" and (not argv or argv[0] != command):
        argv = (command, *argv)
    return Case(command=command, name=name, argv=tuple(argv), **kw)


def plan_cases() -> list[Case]:
    c = "plan"
    bad = "bad.yaml"
    m = ("--model", "tiny-gpt", "--iterations", "5")

    def with_cluster(name: str, text: str | bytes, *mention: str) -> Case:
        return _cli(c, name, "--cluster", bad, *m, files={bad: text}, mention=(bad, *mention))

    return [
        _cli(c, "unknown scenario", "--scenario", "nosuch", mention=("nosuch",)),
        _cli(c, "unknown model", "--scenario", "cpu-demo", "--model", "nosuch-model", mention=("nosuch-model",)),
        _cli(c, "missing cluster file", "--cluster", "missing.yaml", *m, mention=("missing.yaml",)),
        _cli(c, "cluster is a folder", "--cluster", "adir", *m, mention=("adir",)),
        with_cluster("empty cluster file", ""),
        with_cluster("binary cluster file", BINARY),
        with_cluster("cluster file is a YAML list", "- a\n- b\n"),
        with_cluster("huge cluster file (80k clusters, 5 MiB)", "clusters:\n" + "  - {name: c, nodes: {count: 1, "
                     "devices_per_node: 1, device: cpu}}\n" * 80_000, "MiB"),
        with_cluster("cluster YAML syntax error", "clusters: [\n  {name: x\n"),
        with_cluster("nodes.count negative", node0(count=-1), "count"),
        with_cluster("nodes.count NaN", node0(count=float("nan")), "count"),
        with_cluster("nodes.count inf", node0(count=float("inf")), "count"),
        with_cluster("nodes.count 1.5", node0(count=1.5), "count"),
        with_cluster("devices_per_node a word", node0(devices_per_node="eight"), "devices_per_node"),
        with_cluster("devices_per_node boolean", node0(devices_per_node=True), "devices_per_node"),
        with_cluster("absurd device count", node0(count=10**9, devices_per_node=10**6), "devices"),
        with_cluster("unknown device", node0(device="nosuch-gpu"), "nosuch-gpu"),
        with_cluster("empty device name", node0(device=""), "device"),
        with_cluster("speed_factor inf", cluster(lambda d: d["clusters"][0].update(speed_factor=float("inf"))),
                     "speed_factor"),
        with_cluster("speed_factor negative", cluster(lambda d: d["clusters"][0].update(speed_factor=-1)),
                     "speed_factor"),
        with_cluster("speed_factor NaN", cluster(lambda d: d["clusters"][0].update(speed_factor=float("nan"))),
                     "speed_factor"),
        with_cluster("duplicate cluster names", cluster(lambda d: d["clusters"][1].update(name="fast")), "fast"),
        _cli(c, "unicode cluster name is refused (it becomes a folder, a shell word and a label)", "--cluster", bad,
             *m, files={bad: cluster(lambda d: d["clusters"][0].update(name="fäst☃"))}, mention=(bad, "name")),
        with_cluster("bandwidth without unit", cluster(lambda d: d["links"]["default"].update(bandwidth=200)),
                     "bandwidth"),
        with_cluster("bandwidth NaN", cluster(lambda d: d["links"]["default"].update(bandwidth="nan Gbps")),
                     "bandwidth"),
        with_cluster("bandwidth negative", cluster(lambda d: d["links"]["default"].update(bandwidth="-1Gbps")),
                     "bandwidth"),
        with_cluster("latency negative", cluster(lambda d: d["links"]["default"].update(latency="-5ms")),
                     "latency"),
        with_cluster("unknown field", cluster(lambda d: d["clusters"][0].update(nodez=1)), "nodez"),
        with_cluster("no clusters", cluster(lambda d: d.update(clusters=[])), "clusters"),
        with_cluster("link override names an unknown cluster", cluster(lambda d: d["links"].update(
            overrides=[{"between": ["fast", "nowhere"], "bandwidth": "1Gbps"}])), "nowhere"),
        with_cluster("nodes a string", cluster(lambda d: d["clusters"][0].update(nodes="lots")), "nodes"),
        _cli(c, "--gbs 0", "--scenario", "cpu-demo", "--gbs", "0", mention=("--gbs",)),
        _cli(c, "--gbs negative", "--scenario", "cpu-demo", "--gbs", "-5", mention=("--gbs",)),
        _cli(c, "--gbs not a number", "--scenario", "cpu-demo", "--gbs", "nan", mention=("--gbs",)),
        _cli(c, "--gbs absurd", "--scenario", "cpu-demo", "--gbs", str(10**18), mention=("--gbs",)),
        _cli(c, "--seq 0", "--scenario", "cpu-demo", "--seq", "0", mention=("--seq",)),
        _cli(c, "--seq beyond the model", "--scenario", "cpu-demo", "--seq", str(10**9), mention=("--seq",)),
        _cli(c, "unknown planner", "--scenario", "cpu-demo", "--planner", "nosuch", mention=("--planner",)),
        _cli(c, "unknown precision", "--scenario", "cpu-demo", "--precision", "fp8", mention=("--precision",)),
        _cli(c, "unknown schedule", "--scenario", "cpu-demo", "--schedules", "zigzag", mention=("zigzag",)),
        _cli(c, "empty schedule list", "--scenario", "cpu-demo", "--schedules", "", mention=("--schedules",)),
        _cli(c, "unknown dp sharding", "--scenario", "cpu-demo", "--dp-sharding", "zero9", mention=("zero9",)),
        _cli(c, "--no-zero1 takes zero1 out of --dp-sharding (tested design)", "--scenario", "cpu-demo",
             "--no-zero1", "--dp-sharding", "zero1,fsdp", *QUICK_SEARCH, accept=True),
        _cli(c, "fsdp with fp16", "--scenario", "cpu-demo", "--dp-sharding", "fsdp", "--precision", "fp16",
             mention=("fp16",)),
        _cli(c, "--memory-headroom 1.5", "--scenario", "cpu-demo", "--memory-headroom", "1.5",
             mention=("--memory-headroom",)),
        _cli(c, "--memory-headroom NaN", "--scenario", "cpu-demo", "--memory-headroom", "nan",
             mention=("--memory-headroom",)),
        _cli(c, "--memory-headroom negative", "--scenario", "cpu-demo", "--memory-headroom", "-0.1",
             mention=("--memory-headroom",)),
        _cli(c, "--budget negative", "--scenario", "cpu-demo", "--budget", "-1", mention=("--budget",)),
        _cli(c, "--budget NaN", "--scenario", "cpu-demo", "--budget", "nan", mention=("--budget",)),
        _cli(c, "--budget inf is no budget", "--scenario", "cpu-demo", "--budget", "inf", *QUICK_SEARCH,
             accept=True),
        _cli(c, "--iterations negative", "--scenario", "cpu-demo", "--iterations", "-1", mention=("--iterations",)),
        _cli(c, "--iterations 0", "--scenario", "cpu-demo", "--iterations", "0", mention=("--iterations",)),
        _cli(c, "--max-evaluations 0", "--scenario", "cpu-demo", "--max-evaluations", "0",
             mention=("--max-evaluations",)),
        _cli(c, "--patience negative", "--scenario", "cpu-demo", "--patience", "-1", mention=("--patience",)),
        _cli(c, "--jobs 0", "--scenario", "cpu-demo", "--jobs", "0", mention=("--jobs",)),
        _cli(c, "--jobs 100000 (more than the cores: lowered to them)", "--scenario", "cpu-demo", "--jobs", "100000",
             *QUICK_SEARCH, accept=True),
        _cli(c, "scenario and cluster both", "--scenario", "cpu-demo", "--cluster", "cluster.yaml",
             mention=("--cluster",)),
        _cli(c, "-o overwrites the cluster file", "--cluster", "cluster.yaml", *m, "-o", "cluster.yaml",
             protect=("cluster.yaml",), mention=("cluster.yaml",)),
        _cli(c, "--plot overwrites the cluster file", "--cluster", "cluster.yaml", *m, "--plot", "cluster.yaml",
             protect=("cluster.yaml",), mention=("cluster.yaml",)),
        _cli(c, "-o overwrites the model config", "--cluster", "cluster.yaml", "--model", "config.json",
             "--iterations", "5", "-o", "config.json", protect=("config.json",), mention=("config.json",)),
        _cli(c, "-o is a folder", "--scenario", "cpu-demo", "-o", "adir", mention=("adir",)),
        _cli(c, "-o and --plot the same file", "--scenario", "cpu-demo", "-o", "same.png", "--plot", "same.png",
             mention=("-o", "--plot")),
        _cli(c, "-o unwritable", "--scenario", "cpu-demo", "-o", "/proc/hetauto/plan.json", mention=("/proc",)),
        _cli(c, "--plot unwritable", "--scenario", "cpu-demo", "--plot", "/proc/hetauto/p.png", mention=("--plot",)),
        _cli(c, "--resume missing folder", "--scenario", "cpu-demo", "--resume", "nockpt", "-o", "new.json", mention=("nockpt",)),
        _cli(c, "--resume corrupt manifest", "--scenario", "cpu-demo", "--resume", "ckpt", "-o", "new.json",
             files={"ckpt/step-00000001/manifest.json": "{nope"}, mention=("manifest.json",)),
        _cli(c, "model config.json not JSON", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": "{"}, mention=("config.json",)),
        _cli(c, "model config negative layers", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": json.dumps(HF_CONFIG | {"n_layer": -1})}, mention=("n_layer",)),
        _cli(c, "model config hidden a word", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": json.dumps(HF_CONFIG | {"n_embd": "big"})}, mention=("n_embd",)),
        _cli(c, "model config huge hidden", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             "--iterations", "5", files={"bad/config.json": json.dumps(HF_CONFIG | {"n_embd": 4 * 10**12})},
             mention=("memory",)),
        _cli(c, "model config zero heads", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": json.dumps(HF_CONFIG | {"n_head": 0})}, mention=("n_head",)),
        _cli(c, "model config vocab 0", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": json.dumps(HF_CONFIG | {"vocab_size": 0})}, mention=("vocab_size",)),
        _cli(c, "model config positions 0", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": json.dumps(HF_CONFIG | {"n_positions": 0})}, mention=("n_positions",)),
        _cli(c, "model config a JSON list", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": "[1]"}, mention=("config.json",)),
        _cli(c, "model config layers a float", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": json.dumps(HF_CONFIG | {"n_layer": 2.5})}, mention=("n_layer",)),
        _cli(c, "model config rms_norm_eps NaN", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": json.dumps(LLAMA_CONFIG | {"rms_norm_eps": float("nan")})},
             mention=("rms_norm_eps",)),
        _cli(c, "model config rope_theta inf", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": json.dumps(LLAMA_CONFIG | {"rope_theta": float("inf")})},
             mention=("rope_theta",)),
        _cli(c, "model config unknown model_type", "--cluster", "cluster.yaml", "--model", "bad/config.json",
             files={"bad/config.json": json.dumps(HF_CONFIG | {"model_type": "mamba"})}, mention=("mamba",)),
        with_cluster("device profile file missing", node0(device="./nodev.yaml"), "nodev.yaml"),
        _cli(c, "device profile file corrupt", "--cluster", bad, *m,
             files={bad: node0(device="./dev.yaml"), "dev.yaml": "peak: {unclosed"}, mention=("dev.yaml",)),
        _cli(c, "device profile file nested deep", "--cluster", bad, *m,
             files={bad: node0(device="./dev.yaml"), "dev.yaml": "[" * 50_000 + "]" * 50_000},
             mention=("dev.yaml",)),
        _cli(c, "HETAUTO_PLUGINS names a missing module", "--scenario", "cpu-demo", *QUICK_SEARCH,
             env={"HETAUTO_PLUGINS": "no_such_module_xyz"}, accept=True),
        _cli(c, "model is a folder", "--cluster", "cluster.yaml", "--model", "adir", mention=("adir",)),
        _cli(c, "--seed not a number", "--scenario", "cpu-demo", "--seed", "x", mention=("--seed",)),
    ]


def simulate_cases() -> list[Case]:
    c = "simulate"
    syn = ("--synthetic", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--tf", "1", "--tb", "2")
    sz = ("--synthetic", "--schedule", "1f1b", "--tf", "1", "--tb", "2")
    return [
        _cli(c, "missing plan", "missing.json", mention=("missing.json",)),
        _cli(c, "plan is a folder", "adir", mention=("adir",)),
        _cli(c, "empty plan", "bad.json", files={"bad.json": ""}, mention=("bad.json",)),
        _cli(c, "binary plan", "bad.json", files={"bad.json": BINARY}, mention=("bad.json",)),
        _cli(c, "plan is a JSON list", "bad.json", files={"bad.json": "[1, 2]"}, mention=("bad.json",)),
        _cli(c, "plan nested 100k deep", "bad.json", files={"bad.json": DEEP}, mention=("bad.json",)),
        _cli(c, "no plan, no --synthetic", mention=("--synthetic",)),
        _cli(c, "plan and --synthetic", "plan.json", *syn, mention=("--synthetic",)),
        _cli(c, "--stages 0", *sz, "--stages", "0", "--microbatches", "4", mention=("--stages",)),
        _cli(c, "--stages negative", *sz, "--stages", "-3", "--microbatches", "4", mention=("--stages",)),
        _cli(c, "--microbatches 0", *sz, "--stages", "2", "--microbatches", "0",
             mention=("--microbatches",)),
        _cli(c, "--tf NaN", *syn, "--tf", "nan", mention=("--tf",)),
        _cli(c, "--tf negative", *syn, "--tf", "-1", mention=("--tf",)),
        _cli(c, "--tb inf", *syn, "--tb", "inf", mention=("--tb",)),
        _cli(c, "--virtual-chunks 0", "--synthetic", "--schedule", "interleaved", "--stages", "2", "--tf", "1", "--tb", "2",
             "--microbatches", "4", "--virtual-chunks", "0", mention=("--virtual-chunks",)),
        _cli(c, "unknown schedule", "--synthetic", "--schedule", "zigzag", mention=("--schedule",)),
        _cli(c, "--link-latency not I:C", *syn, "--link-latency", "x", mention=("--link-latency",)),
        _cli(c, "--link-latency past the last boundary", *syn, "--link-latency", "99:1",
             mention=("--link-latency",)),
        _cli(c, "--link-latency negative", *syn, "--link-latency", "0:-1", mention=("--link-latency",)),
        _cli(c, "--link-bandwidth 0", *syn, "--link-bandwidth", "0:0", "--activation-bytes", "10",
             mention=("--link-bandwidth",)),
        _cli(c, "--link-bandwidth NaN", *syn, "--link-bandwidth", "0:nan", "--activation-bytes", "10",
             mention=("--link-bandwidth",)),
        _cli(c, "--memory-cap 0", *syn, "--memory-cap", "0:0", mention=("--memory-cap",)),
        _cli(c, "--activation-bytes negative", *syn, "--activation-bytes", "-1", mention=("--activation-bytes",)),
        _cli(c, "absurd synthetic pipeline", *sz, "--stages", "100000",
             "--microbatches", "1000000", mention=("--stages",)),
        _cli(c, "--trace overwrites the plan", "plan.json", "--trace", "plan.json", protect=("plan.json",),
             mention=("plan.json",)),
        _cli(c, "--gantt overwrites the plan", "plan.json", "--gantt", "plan.json", protect=("plan.json",),
             mention=("plan.json",)),
        _cli(c, "--trace unwritable", "plan.json", "--trace", "/proc/hetauto/t.json", mention=("--trace",)),
        _cli(c, "--trace and --gantt the same file", "plan.json", "--trace", "t.png", "--gantt", "t.png",
             mention=("--trace", "--gantt")),
        _cli(c, "--trace is a folder", "plan.json", "--trace", "adir", mention=("adir",)),
        # a what-if: the plan's cut priced as interleaved would run it (v = 2 chunks per stage), a valid question
        _cli(c, "--schedule interleaved on a plan without chunks (a what-if)", "plan.json", "--schedule",
             "interleaved", accept=True),
        _cli(c, "--memory-cap past the plan's stages", "plan.json", "--memory-cap", "7:1", mention=("--memory-cap",)),
        _cli(c, "--stages with a plan", "plan.json", "--stages", "9", mention=("--stages",)),
        _cli(c, "--memory-headroom 2", "plan.json", "--memory-headroom", "2", mention=("--memory-headroom",)),
    ]


def evaluate_cases() -> list[Case]:
    c = "evaluate"

    def bad(name: str, text: str | bytes, *mention: str, **kw: Any) -> Case:
        return _cli(c, name, "bad.json", files={"bad.json": text}, mention=("bad.json", *mention), **kw)

    def fit(name: str, text: str, *mention: str) -> Case:
        """The plan parses; a check against its cluster or model refuses it, naming the stage and field."""
        return _cli(c, name, "bad.json", files={"bad.json": text}, mention=mention)

    return [
        _cli(c, "missing plan", "missing.json", mention=("missing.json",)),
        _cli(c, "plan is a folder", "adir", mention=("adir",)),
        bad("empty plan", ""),
        bad("binary plan", BINARY),
        bad("plan nested 100k deep", DEEP),
        bad("plan is a string", '"hello"'),
        bad("huge plan (20k stages)", plan_set(stages=[PLAN["stages"][0]] * 20_000), "stages"),
        bad("unknown schema", plan_set(schema="hetauto.plan/9"), "schema"),
        bad("no stages", plan_set(stages=[]), "stages"),
        bad("stage tp 0", stage0(tp=0), "tp"),
        bad("layers reversed", stage0(layers=[3, 1]), "layer range"),
        bad("layers negative", stage0(layers=[-1, 3]), "layer range"),
        bad("device listed twice", plan(lambda d: d["stages"][2].update(devices=[0, 0])), "device"),
        fit("device index out of range", stage0(devices=[99]), "99"),
        fit("device index negative", stage0(devices=[-1]), "-1"),
        fit("unknown stage cluster", stage0(cluster="nowhere"), "nowhere"),
        fit("wrong device type", stage0(device_type="h100"), "h100"),
        fit("layers leave a gap", plan(lambda d: d["stages"][1].update(layers=[4, 5])), "bad.json", "contiguous"),
        fit("layers past the model", plan(lambda d: d["stages"][2].update(layers=[5, 60])), "layer"),
        fit("unknown model", plan_set(model="nosuch-model"), "nosuch-model"),
        fit("unknown cluster scenario", plan_set(cluster="nosuch-scenario"), "nosuch-scenario"),
        bad("seq_len negative", plan_set(seq_len=-1), "seq_len"),
        fit("seq_len beyond the model", plan_set(seq_len=10**6), "seq_len"),
        bad("global_batch a word", plan_set(global_batch="many"), "global_batch"),
        bad("global_batch a float", plan_set(global_batch=160.5), "global_batch"),
        bad("microbatches do not multiply to the batch", plan_set(num_microbatches=4), "global_batch"),
        bad("absurd microbatch count", plan_set(num_microbatches=10**12, microbatch_size=1,
                                                global_batch=10**12), "microbatch"),
        bad("memory_headroom 1", plan_set(memory_headroom=1.0), "memory_headroom"),
        bad("memory_headroom NaN literal", plan_set(memory_headroom=0.1).replace("0.1", "NaN"), "memory_headroom"),
        bad("prediction with Infinity", plan_set(prediction={
            "iteration_time_s": 1.0, "throughput_samples_s": 1.0, "tokens_s": 1.0, "bubble_fraction": 0.1,
            "peak_memory_bytes": [1.0]}).replace('"iteration_time_s": 1.0', '"iteration_time_s": Infinity'),
            "iteration_time_s"),
        bad("1e999 seq_len", plan_set(seq_len=32).replace('"seq_len": 32', '"seq_len": 1e999'), "seq_len"),
        bad("unknown schedule", plan_set(schedule={"name": "zigzag"}), "schedule"),
        bad("unknown resharding", plan_set(resharding=["teleport", "teleport"]), "resharding"),
        bad("extra_warmup negative", plan_set(schedule={"name": "virtual-1f1b", "extra_warmup": [-5, -5]}),
            "extra_warmup"),
        bad("unknown field", plan_set(stagez=[]), "stagez"),
        bad("device index a float", stage0(devices=[0.5]), "devices"),
        bad("dp_shares do not sum to the microbatch", plan(lambda d: d["stages"][2].update(dp_shares=[1, 1])),
            "dp_shares"),
        bad("dp_shares zero", plan(lambda d: d["stages"][2].update(dp_shares=[0, 32])), "dp_shares"),
        bad("chunks without interleaved", stage0(chunks=[[0, 1], [1, 3]]), "chunks"),
        bad("virtual_chunks 0", plan_set(schedule={"name": "interleaved", "virtual_chunks": 0}), "virtual_chunks"),
        bad("resharding list too short", plan_set(resharding=["scatter-allgather"]), "resharding"),
        bad("utf-16 plan", json.dumps(PLAN).encode("utf-16"), "bad.json"),
        bad("unknown precision", plan_set(training={"precision": "fp8"}), "precision"),
        fit("cluster file missing", plan_set(cluster="gone.yaml"), "gone.yaml"),
        _cli(c, "--cluster unknown", "plan.json", "--cluster", "nosuch", mention=("nosuch",)),
        _cli(c, "--cluster without the plan's clusters", "plan.json", "--cluster", "mixed-small",
             mention=("fast",)),
        _cli(c, "--memory-headroom NaN", "plan.json", "--memory-headroom", "nan", mention=("--memory-headroom",)),
        _cli(c, "--precision fp8", "plan.json", "--precision", "fp8", mention=("--precision",)),
        _cli(c, "valid plan", "plan.json", accept=True),
    ]


def run_cases_() -> list[Case]:
    c = "run"
    p = "plan.json"
    return [
        _cli(c, "missing plan", "missing.json", mention=("missing.json",)),
        _cli(c, "plan is a folder", "adir", mention=("adir",)),
        _cli(c, "binary plan", "bad.json", files={"bad.json": BINARY}, mention=("bad.json",)),
        _cli(c, "--steps 0", p, "--steps", "0", mention=("--steps",)),
        _cli(c, "--steps negative", p, "--steps", "-1", mention=("--steps",)),
        _cli(c, "--steps absurd is no error (train until stopped)", p, "--steps", str(10**30), accept=True),
        _cli(c, "--timeout 0", p, "--timeout", "0", mention=("--timeout",)),
        _cli(c, "--timeout NaN", p, "--timeout", "nan", mention=("--timeout",)),
        _cli(c, "--lr NaN", p, "--lr", "nan", mention=("--lr",)),
        _cli(c, "--lr negative", p, "--lr", "-1", mention=("--lr",)),
        _cli(c, "--lr inf", p, "--lr", "inf", mention=("--lr",)),
        _cli(c, "--warmup-steps negative", p, "--warmup-steps", "-1", mention=("--warmup-steps",)),
        _cli(c, "--min-lr NaN", p, "--min-lr", "nan", mention=("--min-lr",)),
        _cli(c, "--weight-decay NaN", p, "--weight-decay", "nan", mention=("--weight-decay",)),
        _cli(c, "--eval-every 0", p, "--eval-every", "0", mention=("--eval-every",)),
        _cli(c, "--eval-fraction 1.5", p, "--data", "tokens.bin", "--eval-every", "1", "--eval-fraction", "1.5",
             mention=("--eval-fraction",)),
        _cli(c, "--clip-grad negative", p, "--clip-grad", "-1", mention=("--clip-grad",)),
        _cli(c, "--clip-grad NaN", p, "--clip-grad", "nan", mention=("--clip-grad",)),
        _cli(c, "--checkpoint-every 0", p, "--checkpoint-dir", "cd", "--checkpoint-every", "0",
             mention=("--checkpoint-every",)),
        _cli(c, "--keep 0", p, "--checkpoint-dir", "cd", "--keep", "0", mention=("--keep",)),
        _cli(c, "--checkpoint-dir is a file", p, "--checkpoint-dir", "plan.json", protect=("plan.json",),
             mention=("plan.json",)),
        _cli(c, "--checkpoint-dir unwritable", p, "--checkpoint-dir", "/proc/hetauto-ckpt",
             mention=("--checkpoint-dir",)),
        _cli(c, "--resume missing", p, "--resume", "nockpt", mention=("nockpt",)),
        _cli(c, "--resume corrupt manifest", p, "--resume", "ckpt",
             files={"ckpt/step-00000001/manifest.json": "[]"}, mention=("manifest.json",)),
        _cli(c, "--resume a file", p, "--resume", "plan.json", mention=("plan.json",)),
        _cli(c, "--data missing", p, "--data", "nodata.bin", mention=("nodata.bin",)),
        _cli(c, "--data a text file", p, "--data", "text.txt", mention=("text.json", "sidecar")),
        _cli(c, "--data empty token file", p, "--data", "empty.bin", files={"empty.bin": b""},
             mention=("empty.json", "sidecar")),
        _cli(c, "--data an empty folder", p, "--data", "adir", mention=("adir",)),
        _cli(c, "--data sidecar corrupt", p, "--data", "prepared.bin", setup=lambda f: (
            _prepared_tokens(f), (f / "prepared.json").write_text("{nope")), mention=("prepared.json",)),
        _cli(c, "--data sidecar of another format", p, "--data", "prepared.bin", setup=lambda f: (
            _prepared_tokens(f), _edit_json(f / "prepared.json", lambda d: d.update(format="x"))),
            mention=("prepared.json",)),
        _cli(c, "--data sidecar token count wrong", p, "--data", "prepared.bin", setup=lambda f: (
            _prepared_tokens(f), _edit_json(f / "prepared.json", lambda d: d.update(tokens=10**9))),
            mention=("prepared",)),
        _cli(c, "--data vocabulary larger than the model's", p, "--data", "prepared.bin", setup=lambda f: (
            (f / "text.txt").write_text("hostile " * 2000), _prepared_tokens(f),
            _edit_json(f / "prepared.json", lambda d: d.update(vocab_size=50257))), mention=("vocab",)),
        _cli(c, "--keep without --checkpoint-dir", p, "--keep", "2", mention=("--checkpoint-dir",)),
        _cli(c, "--checkpoint-every without --checkpoint-dir", p, "--checkpoint-every", "2",
             mention=("--checkpoint-dir",)),
        _cli(c, "--eval-steps without --eval-every", p, "--eval-steps", "3", mention=("--eval-every",)),
        _cli(c, "--eval-fraction without --data", p, "--eval-every", "1", "--eval-fraction", "0.2",
             mention=("--data",)),
        _cli(c, "--min-lr above --lr", p, "--lr", "0.001", "--min-lr", "0.1", "--lr-schedule", "cosine",
             mention=("--min-lr",)),
        _cli(c, "--min-lr with a constant schedule", p, "--min-lr", "0.0001", mention=("--min-lr",)),
        _cli(c, "--eval-steps 0", p, "--eval-every", "1", "--eval-steps", "0", mention=("--eval-steps",)),
        _cli(c, "--resume a checkpoint of another model", p, "--resume", "ckpt", files={
            "ckpt/step-00000001/manifest.json": manifest(model=MODEL | {"hidden": 128})}, mention=("hidden",)),
        _cli(c, "--data-column without --data", p, "--data-column", "ids", mention=("--data-column",)),
        _cli(c, "--init-from missing", p, "--init-from", "nomodel", mention=("nomodel",)),
        _cli(c, "--init-from a folder without config", p, "--init-from", "adir", mention=("adir",)),
        _cli(c, "--init-from config without weights", p, "--init-from", "hf", files={"hf/config.json": json.dumps(
            HF_CONFIG)}, mention=("safetensors",)),
        _cli(c, "--init-from corrupt safetensors", p, "--init-from", "hf", files={
            "hf/config.json": json.dumps(HF_CONFIG), "hf/model.safetensors": b"\xff" * 64},
            mention=("model.safetensors",)),
        _cli(c, "HETAUTO_MOCK_DEVICES a word (a child process)", p, "--steps", "1",
             env={"HETAUTO_MOCK_DEVICES": "many"}, subprocess=True, timeout=60, mention=("HETAUTO_MOCK_DEVICES",)),
        _cli(c, "HETAUTO_MOCK_SPEED negative (a child process)", p, "--steps", "1", env={"HETAUTO_MOCK_SPEED": "-1"},
             subprocess=True, timeout=60, mention=("HETAUTO_MOCK_SPEED",)),
        _cli(c, "--inject-fault garbage", p, "--inject-fault", "boom", mention=("--inject-fault",)),
        _cli(c, "--inject-fault rank out of range", p, "--inject-fault", "rank=99,step=1",
             mention=("--inject-fault",)),
        _cli(c, "--inject-fault step past the run", p, "--inject-fault", "rank=0,step=999",
             mention=("--inject-fault",)),
        _cli(c, "--trace overwrites the plan", p, "--trace", "plan.json", protect=("plan.json",),
             mention=("plan.json",)),
        _cli(c, "--log-jsonl appends to the plan", p, "--log-jsonl", "plan.json", protect=("plan.json",),
             mention=("plan.json",)),
        _cli(c, "--tensorboard is a file", p, "--tensorboard", "text.txt", protect=("text.txt",),
             mention=("text.txt",)),
        _cli(c, "--trace unwritable", p, "--trace", "/proc/hetauto/t.json", mention=("--trace",)),
        _cli(c, "--trace and --log-jsonl the same file", p, "--trace", "t.json", "--log-jsonl", "t.json",
             mention=("--trace", "--log-jsonl")),
        _cli(c, "--master without --print-launch", p, "--master", "node0", mention=("--master",)),
        _cli(c, "--print-launch --master a bare IPv6 address", p, "--print-launch", "--master", "fd00::1", accept=True),
        _cli(c, "--max-restarts negative", p, "--max-restarts", "-1", mention=("--max-restarts",)),
        _cli(c, "--max-restarts with netns", p, "--emulate", "netns", "--max-restarts", "1",
             mention=("--max-restarts",)),
        _cli(c, "--memory-headroom 1", p, "--memory-headroom", "1", mention=("--memory-headroom",)),
        _cli(c, "--emulate unknown", p, "--emulate", "qemu", mention=("--emulate",)),
        _cli(c, "--allow-data-change without --resume", p, "--allow-data-change", mention=("--resume",)),
        _cli(c, "--seed not a number", p, "--seed", "x", mention=("--seed",)),
        _cli(c, "plan on a missing cluster file", "bad.json", files={"bad.json": plan_set(cluster="gone.yaml")},
             mention=("gone.yaml",)),
    ]


def launch_cases() -> list[Case]:
    c = "launch"
    base_argv = ("plan.json", "-o", "out")

    def la(name: str, *argv: str, master: str = "10.0.0.1", **kw: Any) -> Case:
        return _cli(c, name, *base_argv, "--master", master, *argv, **kw)

    return [
        la("--master empty", master="", mention=("--master",)),
        la("--master port 0", master="host:0", mention=("--master",)),
        la("--master port 99999", master="host:99999", mention=("--master",)),
        la("--master port negative", master="host:-1", mention=("--master",)),
        la("--master port a word", master="host:http", mention=("--master",)),
        la("--master unclosed IPv6", master="[::1", mention=("--master",)),
        la("--master with a space", master="my host", mention=("--master",)),
        la("--master with a newline", master="host\nrm -rf /", mention=("--master",)),
        _cli(c, "-o missing", "plan.json", "--master", "h", mention=("-o",)),
        _cli(c, "-o is the plan", "plan.json", "--master", "h", "-o", "plan.json", protect=("plan.json",),
             mention=("plan.json",)),
        _cli(c, "-o not empty", "plan.json", "--master", "h", "-o", "ckpt", protect=("ckpt",), mention=("ckpt",)),
        _cli(c, "-o unwritable", "plan.json", "--master", "h", "-o", "/proc/hetauto-launch", mention=("-o",)),
        la("unknown target", "--target", "nosuch", mention=("nosuch",)),
        la("--site-option with the torchrun target", "--site-option", "fast.partition=gpu", mention=("torchrun",)),
        la("--site-option without a dot", "--target", "slurm", "--site-option", "partition=gpu",
           mention=("--site-option",)),
        la("--site-option without =", "--target", "slurm", "--site-option", "fast.partition",
           mention=("--site-option",)),
        la("--site-option empty key", "--target", "slurm", "--site-option", "fast.=gpu", mention=("--site-option",)),
        la("--site-option unknown site", "--target", "slurm", "--site-option", "nosite.partition=gpu",
           mention=("nosite",)),
        la("--site-option unknown key", "--target", "slurm", "--site-option", "fast.partitoin=gpu",
           mention=("partitoin",)),
        la("--site-option value with a newline", "--target", "slurm", "--site-option",
           "fast.partition=gpu\n#SBATCH --wrap=evil", mention=("partition", "one word")),
        la("--env without =", "--env", "NCCL_DEBUG", mention=("--env",)),
        la("--env empty key", "--env", "=1", mention=("--env",)),
        la("--env unknown site", "--env", "nosite:K=V", mention=("nosite",)),
        la("--env key not a name", "--env", "A B=1", mention=("--env",)),
        la("--env value with a newline travels as JSON, never as shell", "--env", "K=v\nrm -rf ~", accept=True),
        la("--iface unknown site", "--iface", "nosite=eth0", mention=("nosite",)),
        la("--iface empty", "--iface", "", mention=("--iface",)),
        la("--iface empty name", "--iface", "fast=", mention=("--iface",)),
        la("--site without =", "--site", "x", mention=("--site",)),
        la("--site empty name", "--site", "=fast,slow", mention=("--site",)),
        la("--site no clusters", "--site", "a=", mention=("--site",)),
        la("--site unknown cluster", "--site", "a=nowhere", mention=("nowhere",)),
        la("--site a cluster twice", "--site", "a=fast", "--site", "b=fast", mention=("fast",)),
        la("--join-timeout 0", "--join-timeout", "0", mention=("--join-timeout",)),
        la("--join-timeout NaN", "--join-timeout", "nan", mention=("--join-timeout",)),
        la("--join-timeout inf", "--join-timeout", "inf", mention=("--join-timeout",)),
        la("--omp-threads 0", "--omp-threads", "0", mention=("--omp-threads",)),
        la("--steps 0", "--steps", "0", mention=("--steps",)),
        la("--data missing", "--data", "nodata.bin", mention=("nodata.bin",)),
        la("slurm time not a duration", "--target", "slurm", "--site-option", "fast.time=soon", mention=("time",)),
        la("kubernetes image empty", "--target", "kubernetes", "--site-option", "fast.image=", mention=("image",)),
        la("kubernetes namespace with a slash", "--target", "kubernetes", "--site-option", "fast.image=img",
           "--site-option", "slow.image=img", "--site-option", "fast.namespace=a/b", mention=("namespace",)),
        la("skypilot cloud names are SkyPilot's to check", "--target", "skypilot", "--site-option",
           "fast.cloud=moon", accept=True),
        la("--master port +80 is port 80", master="host:+80", accept=True),
        la("HETAUTO_BACKEND unknown is not read by launch", env={"HETAUTO_BACKEND": "nosuch"}, accept=True),
        la("valid torchrun launch", accept=True),
    ]


def node_cases() -> list[Case]:
    c = "node"
    return [
        _cli(c, "missing launch plan", "missing.json", "--node-rank", "0", mention=("missing.json",)),
        _cli(c, "launch plan is a folder", "adir", "--node-rank", "0", mention=("adir",)),
        _cli(c, "empty launch plan", "bad.json", "--node-rank", "0", files={"bad.json": ""}, mention=("bad.json",)),
        _cli(c, "a training plan, not a launch plan", "plan.json", "--node-rank", "0", mention=("plan.json",)),
        _cli(c, "launch plan with a wrong field", "L/launch.json", "--node-rank", "0", setup=lambda f: (
            _launch_dir(f), _edit_json(f / "L/launch.json", lambda d: d.update(world_size=-3))),
            mention=("launch.json",)),
        _cli(c, "launch plan's plan edited after launch", "L/launch.json", "--node-rank", "1", setup=lambda f: (
            _launch_dir(f), _edit_json(f / "L/launch.json", lambda d: d["plan"].update(global_batch=320,
                                                                                   num_microbatches=10))),
             mention=("launch.json",)),
        _cli(c, "--node-rank out of range", "L/launch.json", "--node-rank", "99", setup=_launch_dir,
             mention=("--node-rank",)),
        _cli(c, "--node-rank negative", "L/launch.json", "--node-rank", "-1", setup=_launch_dir,
             mention=("--node-rank",)),
        _cli(c, "--node-rank absurd", "L/launch.json", "--node-rank", str(10**30), setup=_launch_dir,
             mention=("--node-rank",)),
        _cli(c, "--visible-devices unknown", "L/launch.json", "--node-rank", "0", "--visible-devices", "all",
             mention=("--visible-devices",)),
        _cli(c, "--node-rank a word", "L/launch.json", "--node-rank", "lead", mention=("--node-rank",)),
        _cli(c, "a valid node rank starts its agent", "L/launch.json", "--node-rank", "1", setup=_launch_dir,
             accept=True),
        _cli(c, "--workdir is a file", "L/launch.json", "--node-rank", "0", "--workdir", "text.txt",
             setup=_launch_dir, protect=("text.txt",), mention=("--workdir",)),
        _cli(c, "--workdir unwritable", "L/launch.json", "--node-rank", "0", "--workdir", "/proc/hetauto-node",
             setup=_launch_dir, mention=("--workdir",)),
    ]


def job_cases() -> list[Case]:
    c = "job"
    return [
        _cli(c, "no launch folder and no --master", "status", mention=("--master",)),
        _cli(c, "missing launch folder", "status", "missing", mention=("missing",)),
        _cli(c, "a folder without launch.json", "logs", "adir", files={"adir": None}, mention=("adir",)),
        _cli(c, "an unknown action", "restart", "L", mention=("restart",)),
        _cli(c, "--master without a secret", "status", "--master", "127.0.0.1:1", mention=("--secret-file",)),
        _cli(c, "--master not an address", "status", "--master", "host:port", "--secret-file", "s.txt",
             files={"s.txt": "a" * 64}, mention=("--master",)),
        _cli(c, "--secret-file too short", "cancel", "--master", "127.0.0.1:1", "--secret-file", "s.txt",
             files={"s.txt": "abc"}, mention=("s.txt",)),
        _cli(c, "no job at the launch's address", "status", "L", setup=_launch_dir, mention=("control store",)),
    ]


def _edit_json(path: Path, edit: Any) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def profile_cases() -> list[Case]:
    c = "profile"
    imp = ("profile", "import")

    def csv(name: str, text: str | bytes, *mention: str, extra: tuple[str, ...] = (), **kw: Any) -> Case:
        return Case(command=c, name=name, argv=(*imp, "--from", "csv", "bad.csv", "--device", "a100-80g", "-o",
                                                "out.yaml", *extra),
                    files={"bad.csv": text}, mention=("bad.csv", *mention), **kw)

    def row(**changes: str) -> str:
        cols = CSV_HEADER.strip().split(",")
        vals = dict(zip(cols, CSV_ROW.strip().split(",")))
        vals.update(changes)
        return CSV_HEADER + ",".join(vals[k] for k in cols) + "\n"

    def metis(name: str, files: dict[str, str | bytes | None], arg: str, *mention: str,
              extra: tuple[str, ...] = ()) -> Case:
        return Case(command=c, name=name, argv=(*imp, "--from", "metis", arg, "--device", "a100-80g", "-o",
                                                "out.yaml", *extra), files=files, mention=mention)

    return [
        Case(command=c, name="csv missing", argv=(*imp, "--from", "csv", "missing.csv", "--device", "a100-80g",
                                                  "-o", "out.yaml"), mention=("missing.csv",)),
        csv("csv empty", ""),
        csv("csv header only", CSV_HEADER),
        csv("csv binary", BINARY),
        csv("csv unknown column", CSV_HEADER.replace("mem_mb", "mem_gb") + CSV_ROW, "mem_gb"),
        csv("csv missing column", "device,kind\na100-80g,block\n", "column"),
        csv("csv fwd_ms NaN", row(fwd_ms="nan"), "fwd_ms"),
        csv("csv fwd_ms inf", row(fwd_ms="inf"), "fwd_ms"),
        csv("csv bwd_ms negative", row(bwd_ms="-3"), "bwd_ms"),
        csv("csv tp 0", row(tp="0"), "tp"),
        csv("csv tp 1.5", row(tp="1.5"), "tp"),
        csv("csv unknown kind", row(kind="wormhole"), "wormhole"),
        csv("csv unknown precision", row(precision="fp8"), "fp8"),
        csv("csv short row", CSV_HEADER + "a100-80g,block,1\n", "line 2"),
        csv("csv rows of another device only", row(device="v100-16g"), "a100-80g"),
        Case(command=c, name="-o overwrites the csv", argv=(*imp, "--from", "csv", "layers.csv", "--device",
                                                             "a100-80g", "-o", "layers.csv"),
             protect=("layers.csv",), mention=("layers.csv",)),
        Case(command=c, name="-o is a folder", argv=(*imp, "--from", "csv", "layers.csv", "--device", "a100-80g",
                                                     "-o", "adir"), mention=("adir",)),
        Case(command=c, name="-o unwritable", argv=(*imp, "--from", "csv", "layers.csv", "--device", "a100-80g",
                                                    "-o", "/proc/hetauto/p.yaml"), mention=("-o",)),
        Case(command=c, name="-o wrong extension", argv=(*imp, "--from", "csv", "layers.csv", "--device",
                                                         "a100-80g", "-o", "out.txt"), mention=("out.txt",)),
        Case(command=c, name="--device unknown", argv=(*imp, "--from", "csv", "layers.csv", "--device", "nosuch",
                                                       "-o", "out.yaml"), mention=("nosuch",)),
        Case(command=c, name="--from unknown", argv=(*imp, "--from", "excel", "layers.csv", "--device",
                                                     "a100-80g", "-o", "out.yaml"), mention=("--from",)),
        Case(command=c, name="valid csv import", argv=(*imp, "--from", "csv", "layers.csv", "--device",
                                                       "a100-80g", "-o", "out.yaml"), accept=True),
        metis("metis empty folder", {"m": None}, "m", "m"),
        metis("metis file not JSON", {"m/DeviceType.A100_tp1_bs1.json": "{"}, "m", "DeviceType.A100_tp1_bs1.json"),
        metis("metis file a JSON list", {"m/DeviceType.A100_tp1_bs1.json": "[]"}, "m",
              "DeviceType.A100_tp1_bs1.json"),
        metis("metis file missing execution_time", {"m/DeviceType.A100_tp1_bs1.json": json.dumps(
            {k: v for k, v in METIS.items() if k != "execution_time"})}, "m", "execution_time"),
        metis("metis negative layer time", {"m/DeviceType.A100_tp1_bs1.json": json.dumps(
            METIS | {"execution_time": METIS["execution_time"] | {"layer_compute_total_ms": [0.5, -3.0, 0.5]}})},
            "m", "layer_compute_total_ms"),
        metis("metis layer count disagrees", {"m/DeviceType.A100_tp1_bs1.json": json.dumps(
            METIS | {"execution_memory": {"total_memory": 1, "layer_memory_total_mb": [1]}})},
            "m", "layer_memory_total_mb"),
        metis("metis file name without tp/bs", {"m/profile.json": json.dumps(METIS)}, "m/profile.json",
              "profile.json"),
        Case(command=c, name="--precision with --from csv", argv=(*imp, "--from", "csv", "layers.csv", "--device",
                                                                  "a100-80g", "-o", "out.yaml", "--precision", "bf16"),
             mention=("--precision",)),
        metis("metis --seq-len 0", {}, METIS_FILE, "--seq-len", extra=("--seq-len", "0")),
        metis("metis --seq-len negative", {}, METIS_FILE, "--seq-len", extra=("--seq-len", "-5")),
        Case(command=c, name="HETAUTO_BACKEND unknown", argv=("profile", "--quick"),
             env={"HETAUTO_BACKEND": "nosuch-backend"}, mention=("nosuch-backend",)),
        Case(command=c, name="--device a corrupt profile file", argv=(*imp, "--from", "csv", "layers.csv", "--device",
                                                                    "dev.yaml", "-o", "out.yaml"),
             files={"dev.yaml": "name: [unclosed"}, mention=("dev.yaml",)),
        Case(command=c, name="metis folder with a stray file", argv=(*imp, "--from", "metis", "m", "--device",
                                                                    "a100-80g", "-o", "out.yaml"),
             files={"m/DeviceType.A100_tp1_bs1.json": json.dumps(METIS), "m/notes.txt": "hi"}, accept=True),
        Case(command=c, name="measure with an unknown backend", argv=("profile", "--backend", "nosuch-backend"),
             mention=("nosuch-backend",)),
        Case(command=c, name="measure with an unknown dtype", argv=("profile", "--backend", "cpu", "--dtypes",
                                                                    "int7"), mention=("int7",)),
        Case(command=c, name="measure with --timeout negative", argv=("profile", "--backend", "cpu", "--timeout",
                                                                      "-1"), mention=("--timeout",)),
        Case(command=c, name="measure -o unwritable", argv=("profile", "--backend", "cpu", "-o",
                                                            "/proc/hetauto/p.yaml"), mention=("-o",)),
    ]


def _bad_calibration(text: str) -> Any:
    def setup(folder: Path) -> None:
        from hetauto.planner.calibration import cache_path

        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return setup


def calibrate_cases() -> list[Case]:
    c = "calibrate"
    return [
        _cli(c, "--show and --check", "--show", "--check", mention=("--check",)),
        _cli(c, "--show without a cache", "--show", mention=("hetauto calibrate",)),
        _cli(c, "--check --runs 0", "--check", "--runs", "0", setup=_bad_calibration("{}"),
             mention=("calibration",)),
        _cli(c, "--runs a word", "--check", "--runs", "x", mention=("--runs",)),
        _cli(c, "--show corrupt cache", "--show", setup=_bad_calibration("{nope"), mention=("calibration",)),
        _cli(c, "HETAUTO_CACHE_DIR is a file", "--show", env={"HETAUTO_CACHE_DIR": "/etc/hostname"},
             mention=("calibrat",)),
        _cli(c, "--show binary cache", "--show", setup=_bad_calibration("\x00\x01\x02"), mention=("calibration",)),
        _cli(c, "--show cache of the wrong shape", "--show", setup=_bad_calibration('{"host": 5, "a": [1]}'),
             mention=("calibration",)),
        _cli(c, "--show cache with NaN", "--show", setup=_bad_calibration('{"version": NaN}'),
             mention=("calibration",)),
    ]


def checkpoint_cases() -> list[Case]:
    c = "checkpoint"
    mf = "ckpt/step-00000001/manifest.json"

    def corrupt(name: str, text: str, *mention: str) -> Case:
        return _cli(c, name, "checkpoint", "verify", "ckpt", files={mf: text}, mention=("manifest", *mention))

    return [
        _cli(c, "no action", "checkpoint", mention=("verify",)),
        _cli(c, "verify missing folder", "checkpoint", "verify", "nockpt", mention=("nockpt",)),
        _cli(c, "verify a file", "checkpoint", "verify", "text.txt", mention=("text.txt",)),
        _cli(c, "verify an empty folder", "checkpoint", "verify", "adir", mention=("adir",)),
        corrupt("manifest not JSON", "{nope"),
        corrupt("manifest empty", ""),
        corrupt("manifest a list", "[]"),
        corrupt("manifest binary", BINARY.decode("latin-1")),
        corrupt("manifest nested 100k deep", DEEP),
        corrupt("manifest wrong format", manifest(format="torch"), "format"),
        corrupt("manifest step negative", manifest(step=-1), "step"),
        corrupt("manifest step a word", manifest(step="one"), "step"),
        corrupt("manifest step 1e30", manifest(step=1e30), "step"),
        corrupt("manifest without files", manifest(files=None), "files"),
        corrupt("manifest files a list", manifest(files=["a"]), "files"),
        corrupt("manifest file outside the folder", manifest(files={"../../../etc/passwd": {"bytes": 1, "sha256": "0"}}),
                "passwd"),
        corrupt("manifest absolute file path", manifest(files={"/etc/passwd": {"bytes": 1, "sha256": "0"}}),
                "passwd"),
        corrupt("manifest file bytes negative", manifest(files={"__0_0.distcp": {"bytes": -1, "sha256": "0"}}),
                "__0_0.distcp"),
        corrupt("manifest file entry a string", manifest(files={"__0_0.distcp": "big"}), "__0_0.distcp"),
        corrupt("manifest world_size 0", manifest(world_size=0), "world_size"),
        corrupt("manifest model a list", manifest(model=[1]), "model"),
        _cli(c, "verify --json corrupt manifest", "checkpoint", "verify", "ckpt", "--json",
             files={mf: "{nope"}, mention=("manifest.json",)),
        _cli(c, "verify a symlink loop", "checkpoint", "verify", "loop", setup=lambda f: (f / "loop").symlink_to(
            f / "loop"), mention=("loop",)),
        _cli(c, "verify an intact checkpoint", "checkpoint", "verify", "ckpt", accept=True),
        _cli(c, "shard truncated", "checkpoint", "verify", "ckpt",
             files={"ckpt/step-00000001/__0_0.distcp": b"\x00"}, mention=("__0_0.distcp",)),
        _cli(c, "shard is a folder", "checkpoint", "verify", "ckpt",
             files={"ckpt/step-00000001/x": None}, setup=_shard_dir, mention=("__0_0.distcp",)),
        _cli(c, "export -o onto the checkpoint (no tensors)", "checkpoint", "export", "ckpt", "-o", "ckpt",
             protect=("ckpt",), mention=("no parameter",)),
        _cli(c, "export -o an existing file (no tensors)", "checkpoint", "export", "ckpt", "-o", "text.txt",
             protect=("text.txt",), mention=("no parameter",)),
        _cli(c, "export a corrupt checkpoint", "checkpoint", "export", "ckpt", "-o", "hf",
             files={mf: manifest(step="x")}, mention=("step",)),
        _cli(c, "export unknown format", "checkpoint", "export", "ckpt", "--format", "gguf", "-o", "hf",
             mention=("--format",)),
    ]


def _shard_dir(folder: Path) -> None:
    shard = folder / "ckpt/step-00000001/__0_0.distcp"
    shard.unlink()
    shard.mkdir()


def data_cases() -> list[Case]:
    c = "data"
    return [
        _cli(c, "no action", "data", mention=("prepare",)),
        _cli(c, "text missing", "data", "prepare", "missing.txt", "-o", "out.bin", mention=("missing.txt",)),
        _cli(c, "text is a folder", "data", "prepare", "adir", "-o", "out.bin", mention=("adir",)),
        _cli(c, "-o overwrites the text", "data", "prepare", "text.txt", "-o", "text.txt", protect=("text.txt",),
             mention=("text.txt",)),
        _cli(c, "-o overwrites the second text", "data", "prepare", "config.json", "text.txt", "-o", "text.txt",
             protect=("text.txt",), mention=("text.txt",)),
        _cli(c, "-o overwrites another file", "data", "prepare", "text.txt", "-o", "cluster.yaml",
             protect=("cluster.yaml",), mention=("cluster.yaml",)),
        _cli(c, "-o whose sidecar is the input", "data", "prepare", "config.json", "-o", "config.bin",
             protect=("config.json",), mention=("config.json",)),
        _cli(c, "-o folder missing", "data", "prepare", "text.txt", "-o", "nodir/t.bin", mention=("nodir",)),
        _cli(c, "-o is a folder", "data", "prepare", "text.txt", "-o", "adir", mention=("adir",)),
        _cli(c, "-o unwritable", "data", "prepare", "text.txt", "-o", "/proc/hetauto/t.bin", mention=("-o",)),
        _cli(c, "--tokenizer unknown", "data", "prepare", "text.txt", "--tokenizer", "nosuch", "-o", "out.bin",
             mention=("--tokenizer",)),
        _cli(c, "--tokenizer folder without tokenizer.json", "data", "prepare", "text.txt", "--tokenizer", "adir",
             "-o", "out.bin", mention=("tokenizer.json",)),
        _cli(c, "--tokenizer corrupt tokenizer.json", "data", "prepare", "text.txt", "--tokenizer", "tok", "-o",
             "out.bin", files={"tok/tokenizer.json": "{nope"}, mention=("tokenizer.json",)),
        _cli(c, "empty text", "data", "prepare", "empty.txt", "-o", "out.bin", files={"empty.txt": ""},
             mention=("empty.txt",)),
        _cli(c, "binary text is documented as accepted", "data", "prepare", "bin.txt", "-o", "out.bin",
             files={"bin.txt": BINARY}, accept=True),
        _cli(c, "-o overwrites an earlier token file it made", "data", "prepare", "text.txt", "-o", "prepared.bin",
             setup=_prepared_tokens, accept=True),
        _cli(c, "token file as text input", "data", "prepare", "prepared.bin", "-o", "out.bin",
             setup=_prepared_tokens, mention=("prepared.bin",)),
    ]


def listing_cases() -> list[Case]:
    out = []
    for cmd in ("models", "devices", "backends", "scenarios"):
        out += [_cli(cmd, "extra argument", cmd, "surprise", mention=("surprise",)),
                _cli(cmd, "unknown flag", cmd, "--bogus", mention=("--bogus",)),
                _cli(cmd, "--json", cmd, "--json", accept=True)]
    out += [_cli("hetauto", "unknown command", "nosuch", mention=("nosuch",)),
            _cli("hetauto", "no command prints help", accept=True),
            _cli("hetauto", "unknown top-level flag", "--frobnicate", mention=("--frobnicate",))]
    return out


def _api(name: str, fn: Any, *mention: str, **kw: Any) -> Case:
    return Case(command="api", name=name, call=fn, mention=mention, **kw)


def api_cases() -> list[Case]:
    import hetauto

    return [
        _api("plan(scenario=5)", lambda: hetauto.plan(5), "scenario"),  # type: ignore[arg-type]
        _api("plan unknown scenario", lambda: hetauto.plan("nosuch"), "nosuch"),
        _api("plan missing cluster file", lambda: hetauto.plan(cluster="missing.yaml", model="tiny-gpt"),
             "missing.yaml"),
        _api("plan global_batch negative", lambda: hetauto.plan("cpu-demo", global_batch=-1), "global_batch"),
        _api("plan global_batch a string", lambda: hetauto.plan("cpu-demo", global_batch="16"),  # type: ignore[arg-type]
             "global_batch"),
        _api("plan seq_len 0", lambda: hetauto.plan("cpu-demo", seq_len=0), "seq_len"),
        _api("plan precision fp8", lambda: hetauto.plan("cpu-demo", precision="fp8"), "precision"),
        _api("plan unknown planner", lambda: hetauto.plan("cpu-demo", planner="nosuch"), "planner"),
        _api("plan budget NaN", lambda: hetauto.plan("cpu-demo", budget=float("nan")), "budget"),
        _api("plan memory_headroom 2", lambda: hetauto.plan("cpu-demo", memory_headroom=2.0), "memory_headroom"),
        _api("plan seed a string", lambda: hetauto.plan("cpu-demo", seed="x"), "seed"),  # type: ignore[arg-type]
        _api("plan max_evaluations 0", lambda: hetauto.plan("cpu-demo", max_evaluations=0), "max_evaluations"),
        _api("plan scenario and cluster", lambda: hetauto.plan("cpu-demo", cluster="cluster.yaml"), "cluster"),
        _api("plan model a dict", lambda: hetauto.plan("cpu-demo", model={"name": "x"}), "model"),  # type: ignore[arg-type]
        _api("evaluate a dict", lambda: hetauto.evaluate({"model": "tiny-gpt"}), "plan"),  # type: ignore[arg-type]
        _api("evaluate None", lambda: hetauto.evaluate(None), "plan"),  # type: ignore[arg-type]
        _api("evaluate missing file", lambda: hetauto.evaluate("missing.json"), "missing.json"),
        _api("evaluate a folder", lambda: hetauto.evaluate(Path("adir")), "adir"),
        _api("evaluate cluster 5", lambda: hetauto.evaluate("plan.json", cluster=5), "cluster"),  # type: ignore[arg-type]
        _api("evaluate corrupt plan", lambda: hetauto.evaluate("bad.json"), "bad.json", files={"bad.json": "{"}),
        _api("run steps 0", lambda: hetauto.run("plan.json", steps=0), "steps"),
        _api("run steps a string", lambda: hetauto.run("plan.json", steps="3"), "steps"),  # type: ignore[arg-type]
        _api("run emulate yes", lambda: hetauto.run("plan.json", emulate="yes"), "emulate"),
        _api("run timeout NaN", lambda: hetauto.run("plan.json", timeout=float("nan")), "timeout"),
        _api("run checkpoint_dir 5", lambda: hetauto.run("plan.json", checkpoint_dir=5), "checkpoint_dir"),  # type: ignore[arg-type]
        _api("run missing plan", lambda: hetauto.run("missing.json"), "missing.json"),
        _api("run trace overwrites the plan", lambda: hetauto.run("plan.json", trace="plan.json"), "plan.json",
             protect=("plan.json",)),
        _api("run reference a string", lambda: hetauto.run("plan.json", reference="no"), "reference"),  # type: ignore[arg-type]
        _api("run emulate 1", lambda: hetauto.run("plan.json", emulate=1), "emulate"),  # type: ignore[arg-type]
        _api("evaluate calibrated a string", lambda: hetauto.evaluate("plan.json", calibrated="no"),  # type: ignore[arg-type]
             "calibrated"),
        _api("plan planner a list", lambda: hetauto.plan("cpu-demo", planner=["mcts"]), "planner"),  # type: ignore[arg-type]
        _api("run a dict", lambda: hetauto.run({"model": "x"}), "plan"),  # type: ignore[arg-type]
        _api("run resume missing", lambda: hetauto.run("plan.json", resume="nockpt"), "nockpt"),
    ]


def all_cases() -> list[Case]:
    """Every case, grouped by command."""
    return (plan_cases() + simulate_cases() + evaluate_cases() + run_cases_() + launch_cases() + node_cases()
            + job_cases()
            + profile_cases() + calibrate_cases() + checkpoint_cases() + data_cases() + listing_cases()
            + api_cases())
