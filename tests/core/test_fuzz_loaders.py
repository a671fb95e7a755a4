"""Hostile inputs for every loader that reads a user file: a mutated or mangled document is either a valid
object or a HetautoError with a one-line message, never another exception (a traceback for the user).

Covered here: model config.json (get_model with a path), device profiles (profile_from_dict and
load_profile), plans (Plan.from_json and Plan.load), Metis profile files (read_metis_file/import_metis),
cluster FILES (load_cluster on raw bytes: encodings, YAML/JSON syntax; the cluster document structure is
fuzzed in test_spec_fuzz.py), and checkpoint manifests / DCP JSON metadata.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetauto.core.cluster import ClusterSpec, load_cluster
from hetauto.core.errors import CheckpointError, HetautoError, SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan
from hetauto.core.profile import DeviceProfile, load_profile, profile_from_dict
from hetauto.core.scenarios import get_scenario
from hetauto.interop.metis import import_metis, metis_filename
from hetauto.runtime.checkpoint import Manifest
from hetauto.runtime.checkpoint_storage import metadata_from_json

from _mutation import mutate, mutation_lists

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
_counter = itertools.count()

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**20, max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
    st.sampled_from(["", "0", "-1", "1e400", "nan", "llama", "gpt2", "a100-40g", "1TFLOPS", "80GiB", "-5GB/s",
                     "1f1b", "lanes", "hetauto.plan/1", "hetauto.profile/1", "step-1", "../x", "float32", "int64"]),
)
mutations = mutation_lists(scalars)


def _expect(fn, ok_type: type | tuple[type, ...], error_type: type = HetautoError) -> Any:
    """fn() returns an `ok_type` or raises `error_type` with a one-line message; anything else fails."""
    try:
        result = fn()
    except error_type as err:
        assert str(err) and "\n" not in str(err), repr(str(err))
        return None
    assert isinstance(result, ok_type), type(result)
    return result


def _write(root: Path, name: str, data: str | bytes) -> Path:
    d = root / f"case{next(_counter)}"
    d.mkdir()
    p = d / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data, encoding="utf-8")
    return p


def _dump(doc: Any) -> str:
    return json.dumps(doc, allow_nan=True)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# ------------------------------------------------------------------------------------- model config.json
MODEL_SEEDS = [
    {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "vocab_size": 100, "intermediate_size": 128, "max_position_embeddings": 256,
     "tie_word_embeddings": False},
    {"model_type": "gpt2", "n_embd": 64, "n_layer": 3, "n_head": 4, "vocab_size": 50257, "n_positions": 1024},
]


@SETTINGS
@given(seed=st.sampled_from(MODEL_SEEDS), muts=mutations)
def test_model_config_json(root: Path, seed: dict, muts: list) -> None:
    path = _write(root, "config.json", _dump(mutate(seed, muts)))
    cfg = _expect(lambda: get_model(path), ModelConfig)
    if cfg is not None:
        assert cfg.num_layers > 0 and cfg.hidden % cfg.num_heads == 0 and cfg.num_heads % cfg.kv_heads == 0


# ------------------------------------------------------------------------------------- device profile
PROFILE_SEEDS = [yaml.safe_load(Path(__file__).parents[2].joinpath("hetauto/data/devices", f).read_text())
                 for f in ("a100-40g.yaml", "ascend-910b.yaml")]
PROFILE_SEEDS.append({"schema": "hetauto.profile/1", "base": "h100", "key": "h100-measured", "peak_flops": "900TFLOPS"})


@SETTINGS
@given(seed=st.sampled_from(range(len(PROFILE_SEEDS))), muts=mutations)
def test_profile_documents(seed: int, muts: list) -> None:
    _expect(lambda: profile_from_dict(mutate(PROFILE_SEEDS[seed], muts), "fuzz-profile.yaml"), DeviceProfile)


# ------------------------------------------------------------------------------------- plan
PLAN_SEED = {
    "schema": "hetauto.plan/1", "model": "gpt3-350m", "cluster": "two-cluster", "seq_len": 128, "global_batch": 8,
    "microbatch_size": 2, "num_microbatches": 4,
    "stages": [
        {"cluster": "a", "device_type": "cuda", "devices": [0, 1], "layers": [0, 3], "tp": 2, "dp": 1},
        {"cluster": "b", "device_type": "npu", "devices": [0, 1], "layers": [3, 6], "tp": 1, "dp": 2, "recompute": True},
    ],
    "schedule": {"name": "virtual-1f1b", "virtual_chunks": 1, "extra_warmup": [1]},
    "resharding": ["lanes"],
    "prediction": {"iteration_time_s": 1.0, "throughput_samples_s": 8.0, "tokens_s": 1024.0, "bubble_fraction": 0.1,
                   "peak_memory_bytes": [1e9, 2e9]},
}


def test_plan_seed_is_valid() -> None:
    assert Plan.from_json(_dump(PLAN_SEED)).num_stages == 2


@SETTINGS
@given(muts=mutations)
def test_plan_documents(root: Path, muts: list) -> None:
    doc = mutate(PLAN_SEED, muts)
    plan = _expect(lambda: Plan.from_json(_dump(doc), "fuzz-plan.json"), Plan)
    if plan is not None:
        assert Plan.from_json(plan.to_json()) == plan  # a valid plan round-trips unchanged
    _expect(lambda: Plan.load(_write(root, "plan.json", _dump(doc))), Plan)


# ------------------------------------------------------------------------------------- Metis files
def _metis_doc(n: int = 4) -> dict:
    return {
        "model": {"model_name": "GPT3", "num_layers": n,
                  "parameters": {"total_parameters_bytes": 1000 * n, "parameters_per_layer_bytes": [1000] * n}},
        "execution_time": {"total_time_ms": 99.0, "forward_backward_time_ms": 40.5, "batch_generator_time_ms": 0.25,
                           "optimizer_time_ms": 3.125, "layer_compute_total_ms": [0.5] + [2.75] * (n - 2) + [1.25]},
        "execution_memory": {"total_memory_mb": 2048.0, "layer_memory_total_mb": [64.0] * n},
    }


@SETTINGS
@given(muts=mutations, name=st.sampled_from([metis_filename("A100", 1, 2), metis_filename("MI250", 2, 1),
                                             metis_filename("NOPE", 1, 1), "DeviceType.A100_tp1_bs1.txt"]))
def test_metis_files(root: Path, muts: list, name: str) -> None:
    path = _write(root, name, _dump(mutate(_metis_doc(), muts)))
    _expect(lambda: import_metis(path.parent), DeviceProfile)


@pytest.mark.parametrize("name", ["DeviceType.A100_tp0_bs1.json", "DeviceType.A100_tp1_bs0.json"])
def test_metis_zero_tp_or_batch_in_the_file_name_is_a_spec_error(root: Path, name: str) -> None:
    path = _write(root, name, _dump(_metis_doc()))
    with pytest.raises(SpecError, match=r"tensor-parallel degree and batch size must be >= 1 \(rename it to "):
        import_metis(path.parent)


# ------------------------------------------------------------------------------------- raw bytes of every file loader
CLUSTER_TEXT = yaml.safe_dump(get_scenario("two-cluster").cluster.to_document(), sort_keys=False)
RAW_SEEDS = {
    "cluster.yaml": CLUSTER_TEXT,
    "config.json": _dump(MODEL_SEEDS[0]),
    "profile.yaml": yaml.safe_dump(PROFILE_SEEDS[0]),
    "plan.json": _dump(PLAN_SEED),
}
LOADERS = {
    "cluster.yaml": (load_cluster, ClusterSpec),
    "config.json": (get_model, ModelConfig),
    "profile.yaml": (load_profile, DeviceProfile),
    "plan.json": (Plan.load, Plan),
}


@SETTINGS
@given(name=st.sampled_from(sorted(RAW_SEEDS)), cut=st.integers(min_value=0, max_value=10**5),
       junk=st.one_of(st.binary(max_size=12), st.sampled_from([b"\xff\xfe", b"\x00", b"{{", b"]]", b": :", b"\t-",
                                                               b"!!python/object:os.system", b"&a *a", b"\xef\xbb\xbf"])))
def test_mangled_bytes_of_every_file_loader(root: Path, name: str, cut: int, junk: bytes) -> None:
    text = RAW_SEEDS[name].encode()
    at = cut % (len(text) + 1)
    path = _write(root, name, text[:at] + junk + text[at:])
    loader, kind = LOADERS[name]
    _expect(lambda: loader(path), kind)


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_missing_empty_and_directory_paths(root: Path, name: str) -> None:
    loader, kind = LOADERS[name]
    for path in (root / "absent" / name, _write(root, name, ""), _write(root, name, "\xa0").parent):
        with pytest.raises(HetautoError) as err:
            loader(path)
        assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------- checkpoint manifest + metadata
MANIFEST_SEED = json.loads(Manifest(step=3, model={"name": "m", "arch": "gpt", "num_layers": 2, "hidden": 8,
                                                   "num_heads": 2, "ffn_hidden": 16, "vocab_size": 10,
                                                   "max_seq_len": 8, "num_kv_heads": None, "tie_embeddings": False},
                                    plan=None, world_size=2, extra={"next_step": 4},
                                    files={"a": {"bytes": 1, "sha256": "0"}}).to_json())
METADATA_SEED = {
    "format": "hetauto.dcp-metadata/1", "version": "1.0.0", "planner_data": {"model.w": ["model.w"]},
    "tensors": {"model.w": {"dtype": "float32", "requires_grad": False, "size": [4, 2],
                            "chunks": [{"offsets": [0, 0], "sizes": [2, 2]}, {"offsets": [2, 0], "sizes": [2, 2]}]}},
    "storage": [{"fqn": "model.w", "offset": [0, 0], "index": 0, "path": "__0_0.distcp", "start": 0, "length": 10,
                 "transforms": None}],
}


@SETTINGS
@given(muts=mutations)
def test_checkpoint_manifest(muts: list) -> None:
    m = _expect(lambda: Manifest.from_json(_dump(mutate(MANIFEST_SEED, muts)), "manifest.json"), Manifest,
                CheckpointError)
    if m is not None:
        assert Manifest.from_json(m.to_json()) == m


@SETTINGS
@given(muts=mutations)
def test_checkpoint_metadata(muts: list) -> None:
    from torch.distributed.checkpoint.metadata import Metadata

    _expect(lambda: metadata_from_json(mutate(METADATA_SEED, muts)), Metadata, ValueError)
