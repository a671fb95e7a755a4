from __future__ import annotations

import copy
import json

import pytest
import yaml

from hetauto.core.cluster import Cluster, ClusterSpec, LinkSpec, cluster_from_dict, load_cluster
from hetauto.core.errors import SpecError
from hetauto.core.profile import catalog

BASE = {
    "clusters": [
        {"name": "a", "nodes": {"count": 2, "devices_per_node": 8, "device": "a100-80g"}},
        {"name": "b", "nodes": {"count": 1, "devices_per_node": 4, "device": "h800"},
         "intra_node": {"bandwidth": "400GB/s", "latency": "3us"}, "inter_node": {"bandwidth": "400Gbps", "latency": "8us"}},
        {"name": "c", "nodes": {"count": 4, "devices_per_node": 8, "device": "ascend-910b"}, "speed_factor": 0.5},
    ],
    "links": {
        "default": {"bandwidth": "100Gbps", "latency": "2ms"},
        "overrides": [{"between": ["b", "a"], "bandwidth": "25GB/s", "latency": "0.5ms", "shared_capacity": "400Gbps"}],
    },
}
KNOWN = ", ".join(sorted(catalog()))


def mutate(fn):
    doc = copy.deepcopy(BASE)
    fn(doc)
    return doc


def test_valid_spec_values():
    spec = cluster_from_dict(BASE, "spec.yaml")
    assert isinstance(spec, ClusterSpec) and spec.names == ("a", "b", "c")
    assert spec.total_devices == 16 + 4 + 32
    a = spec.cluster("a")
    assert isinstance(a, Cluster) and a.num_nodes == 2 and a.devices_per_node == 8 and a.num_devices == 16
    assert a.device.key == "a100-80g" and a.device.peak_flops == 312e12
    # defaults from the device profile: NVLink3 600 GB/s intra, 200 Gb/s NIC
    assert a.intra_node == LinkSpec(600e9, 5e-6) and a.inter_node == LinkSpec(25e9, 10e-6)
    b = spec["b"]
    assert b.intra_node == LinkSpec(400e9, 3e-6) and b.inter_node == LinkSpec(50e9, 8e-6)
    assert spec.link("a", "b") == LinkSpec(25e9, 0.5e-3, 50e9) == spec.link("b", "a")
    # a link with bandwidth and latency alone is the whole path: all flows share it (per: path)
    assert spec.link("a", "c") == LinkSpec(12.5e9, 2e-3, 12.5e9, per="path")
    c = spec["c"]
    assert c.speed_factor == 0.5 and c.device.peak_flops == 313e12 * 0.5
    assert spec.link("a", "c").transfer_time(12.5e9) == pytest.approx(1.002)


def test_link_to_self_and_unknown_cluster():
    spec = cluster_from_dict(BASE)
    with pytest.raises(ValueError, match=r"cluster\('a'\).inter_node"):
        spec.link("a", "a")
    with pytest.raises(KeyError, match="no cluster named 'z'; clusters: a, b, c"):
        spec.link("a", "z")


def test_yaml_and_json_give_the_same_spec(tmp_path):
    y, j = tmp_path / "c.yaml", tmp_path / "c.json"
    y.write_text(yaml.safe_dump(BASE))
    j.write_text(json.dumps(BASE))
    sy, sj = load_cluster(y), load_cluster(j)
    assert sy.clusters == sj.clusters and sy.overrides == sj.overrides and sy.default_link == sj.default_link


def test_to_document_round_trips():
    spec = cluster_from_dict(BASE)
    again = cluster_from_dict(spec.to_document())
    assert again.clusters == spec.clusters and again.overrides == spec.overrides


def test_device_from_profile_file_relative_to_spec(tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.yaml").write_text("base: a100-80g\nkey: my-a100\npeak_flops: 280TFLOPS\n")
    doc = mutate(lambda d: d["clusters"][0]["nodes"].__setitem__("device", "profiles/mine.yaml"))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    spec = load_cluster(tmp_path / "spec.yaml")
    dev = spec["a"].device
    assert dev.key == "my-a100" and dev.peak_flops == 280e12 and dev.memory_bytes == 80 * 2**30


BAD = [
    ("unknown device type",
     lambda d: d["clusters"][0]["nodes"].__setitem__("device", "a100"),
     f"spec.yaml: clusters[0].nodes.device: unknown device type 'a100' (known devices: {KNOWN}; or give a profile file path)"),
    ("negative node count",
     lambda d: d["clusters"][0]["nodes"].__setitem__("count", -1),
     "spec.yaml: clusters[0].nodes.count: must be a positive number of nodes, got -1 (e.g. 8)"),
    ("zero devices per node",
     lambda d: d["clusters"][1]["nodes"].__setitem__("devices_per_node", 0),
     "spec.yaml: clusters[1].nodes.devices_per_node: must be a positive number of devices per node, got 0 (e.g. 8)"),
    ("duplicate cluster name",
     lambda d: d["clusters"][2].__setitem__("name", "a"),
     "spec.yaml: clusters[2].name: duplicate cluster name 'a' (also clusters[0]) (give every cluster a unique name)"),
    ("pair without a link",
     lambda d: d["links"].pop("default"),
     "spec.yaml: links: no link between clusters 'a' and 'c' (add links.default or an override with between: [a, c])"),
    ("bandwidth unit typo",
     lambda d: d["links"]["default"].__setitem__("bandwidth", "100Gbsp"),
     "spec.yaml: links.default.bandwidth: unknown bandwidth unit 'Gbsp' in '100Gbsp'; accepted units: bps, Mbps, "
     "Gbps, Tbps (bits/s), B/s, MB/s, GB/s, TB/s, GiB/s (bytes/s)"),
    ("latency unit typo",
     lambda d: d["links"]["default"].__setitem__("latency", "2 msec"),
     "spec.yaml: links.default.latency: unknown time unit 'msec' in '2 msec'; accepted units: s, ms, us, ns"),
    ("negative latency",
     lambda d: d["clusters"][1]["inter_node"].__setitem__("latency", "-1us"),
     "spec.yaml: clusters[1].inter_node.latency: time value '-1us' must be zero or positive"),
    ("unknown field",
     lambda d: d["clusters"][0].__setitem__("gpus", 8),
     "spec.yaml: clusters[0].gpus: unknown field (expected one of: name, nodes, intra_node, inter_node, speed_factor, backend)"),
    ("missing device",
     lambda d: d["clusters"][0]["nodes"].pop("device"),
     "spec.yaml: clusters[0].nodes.device: required field is missing"),
    ("override names an unknown cluster",
     lambda d: d["links"]["overrides"][0].__setitem__("between", ["a", "z"]),
     "spec.yaml: links.overrides[0].between: unknown cluster 'z' (clusters: a, b, c)"),
    ("override joins a cluster to itself",
     lambda d: d["links"]["overrides"][0].__setitem__("between", ["a", "a"]),
     "spec.yaml: links.overrides[0].between: a link joins two different clusters, got 'a' twice (name two different clusters)"),
    ("duplicate override",
     lambda d: d["links"]["overrides"].append({"between": ["a", "b"], "bandwidth": "1Gbps"}),
     "spec.yaml: links.overrides[1].between: duplicate link between 'a' and 'b' (also links.overrides[0]) "
     "(keep one override per cluster pair)"),
    ("no clusters",
     lambda d: d.__setitem__("clusters", []),
     "spec.yaml: clusters: no clusters; list at least one cluster with name and nodes"),
    ("zero speed factor",
     lambda d: d["clusters"][2].__setitem__("speed_factor", 0),
     "spec.yaml: clusters[2].speed_factor: Input should be greater than 0"),
    ("missing profile file",
     lambda d: d["clusters"][0]["nodes"].__setitem__("device", "./nope.yaml"),
     "spec.yaml: clusters[0].nodes.device: cannot load profile: nope.yaml: file not found (check the path)"),
]


@pytest.mark.parametrize("case, fn, message", BAD, ids=[c[0] for c in BAD])
def test_bad_spec_message(case, fn, message):
    with pytest.raises(SpecError) as err:
        cluster_from_dict(mutate(fn), "spec.yaml")
    assert str(err.value) == message


def test_messages_are_distinct():
    assert len({m for _, _, m in BAD}) == len(BAD)


def test_file_level_errors(tmp_path):
    with pytest.raises(SpecError, match=r"missing.yaml: file not found \(check the path\)"):
        load_cluster(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: [\n")
    with pytest.raises(SpecError, match=r"bad.yaml: line \d+: invalid YAML"):
        load_cluster(bad)
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]")
    with pytest.raises(SpecError, match=r"list.json: expected a mapping at the top level, got list"):
        load_cluster(lst)


def test_deep_nesting_is_refused_before_the_parser_and_quoted_brackets_do_not_count():
    """PyYAML scans `[[[...` in time quadratic in its depth; with the recursion limit torch's compiler sets, 50,000
    brackets parsed for 10 s before failing."""
    from hetauto.core.specio import MAX_FLOW_DEPTH, parse_text

    deep = "[" * (MAX_FLOW_DEPTH + 1) + "]" * (MAX_FLOW_DEPTH + 1)
    with pytest.raises(SpecError) as err:
        parse_text(deep, "dev.yaml")
    assert str(err.value) == ("dev.yaml: document nests more than 100 levels deep (a cluster, model or profile spec "
                              "nests a few levels: is this the right file?)")
    assert parse_text("[" * MAX_FLOW_DEPTH + "]" * MAX_FLOW_DEPTH, "ok.yaml") is not None
    brackets = "'" + "[" * 200 + "'"
    assert parse_text(f"a: {brackets}\nb: \"{{{{\\\"[[\"  # [[[[[[\nc: [1, {{d: 2}}]\n", "q.yaml") == {
        "a": "[" * 200, "b": '{{"[[', "c": [1, {"d": 2}]}


def test_cli_plan_reports_spec_error_in_one_line(tmp_path, capsys):
    from hetauto.cli import main

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(mutate(lambda d: d["links"]["default"].__setitem__("bandwidth", "10Gbsp"))))
    rc = main(["plan", "--cluster", str(p), "--model", "tiny-gpt"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(f"hetauto plan: error: {p}: links.default.bandwidth: unknown bandwidth unit")


def test_cached_device_count_equals_the_sum_over_node_groups_and_survives_replace_and_pickle():
    """`Cluster.num_devices` is computed once (issue 43): it must equal the count it replaced, for one device
    type and for node groups of different node sizes, also after `replace` and a pickle round trip (workers)."""
    import dataclasses
    import pickle

    mixed = cluster_from_dict({"clusters": [{"name": "lab", "nodes": [
        {"count": 1, "devices_per_node": 8, "device": "h100"},
        {"count": 3, "devices_per_node": 4, "device": "a100-80g"}]}]}, "spec.yaml").cluster("lab")
    plain = cluster_from_dict({"clusters": [{"name": "a", "nodes": {"count": 5, "devices_per_node": 8,
                                                                     "device": "a100-80g"}}]}, "s.yaml").cluster("a")
    assert mixed.num_devices == sum(g.count * (g.devices_per_node or mixed.devices_per_node)
                                    for g in mixed.node_groups) == 20
    assert plain.num_devices == plain.num_nodes * plain.devices_per_node == 40
    smaller = dataclasses.replace(plain, num_nodes=2)
    assert smaller.num_devices == 16 and dataclasses.replace(mixed, num_nodes=4, node_groups=()).num_devices == 4 * mixed.devices_per_node
    for c in (mixed, plain, smaller):
        back = pickle.loads(pickle.dumps(c))
        assert back == c and hash(back) == hash(c) and back.num_devices == c.num_devices


def test_libyaml_reads_what_pyyaml_reads_and_a_deep_block_document_is_refused_not_a_crash():
    """Documents go through libyaml's parser where PyYAML has it (7x faster); its composer recurses on the C stack,
    so `- - - ... x` 50,000 deep crashed the process: a document that could nest that deep goes to PyYAML's parser,
    which says so."""
    from pathlib import Path

    from hetauto.core import specio

    shipped = sorted(Path(__file__).resolve().parents[2].glob("hetauto/**/*.yaml"))
    assert shipped and specio._FAST_LOADER is not None
    for path in shipped:
        text = path.read_text()
        assert specio._loader_for(text) is specio._FAST_LOADER
        assert yaml.load(text, Loader=specio._FAST_LOADER) == yaml.load(text, Loader=specio._UniqueKeyLoader)  # noqa: S506
    with pytest.raises(SpecError, match=r"^d.yaml: line 2: invalid YAML: duplicate key 'a' \(also on line 1\)"):
        specio.parse_text("a: 1\na: 2\n", "d.yaml")
    for depth in (2000, 50_000):
        with pytest.raises(SpecError) as err:
            specio.parse_text("- " * depth + "x\n", "deep.yaml")
        assert str(err.value) == "deep.yaml: document nests too deeply"
