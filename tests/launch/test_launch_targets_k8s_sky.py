"""The kubernetes (JobSet) and skypilot (task YAML) launch targets: exact golden files for one heterogeneous plan
(an H100 cluster of 2 nodes x 8 cuda devices and an MI300X cluster of 1 node x 4 rocm devices), the fields checked
against the real schemas, and the node rank each pod or node computes, by running the shell it is given.

Schemas:
- Kubernetes: every replicatedJob's `template` (batch/v1 JobTemplateSpec, holding the pod template) and the JobSet's
  metadata go through the `kubernetes` client's models (V1JobTemplateSpec, V1PodTemplateSpec, V1ObjectMeta); a
  round trip that drops a key means a field the API does not have. The JobSet's own fields are those of
  kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go (JobSet, JobSetSpec, ReplicatedJob; read at commit
  08dfbdfd682714a9ab929633eca8dc95315187e7), kept below as an allow-list.
- SkyPilot: skypilot-org/skypilot sky/utils/schemas.py (skypilot 0.14.1 on PyPI): get_task_schema() and
  get_resources_schema() (both `additionalProperties: False`) as allow-lists; accelerator names from
  skypilot-org/skypilot-catalog catalogs/v7/common/accelerators.csv. Where skypilot is importable its own
  schema validates the tasks too.

HETAUTO_UPDATE_GOLDEN=1 rewrites the golden files (tests/golden/launch/<target>/).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hetauto.backends import get_registry
from hetauto.core.cluster import cluster_from_dict
from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan, StagePlan
from hetauto.core.profile import catalog
from hetauto.launch.plan import LaunchPlan, derive
from hetauto.launch.target_kubernetes import KubernetesTarget, node_groups
from hetauto.launch.target_skypilot import SKYPILOT_ACCELERATORS, SkyPilotTarget
from hetauto.launch.targets import get_targets

GOLDEN = Path(__file__).parents[1] / "golden" / "launch"
UPDATE = os.environ.get("HETAUTO_UPDATE_GOLDEN") == "1"

CLUSTER = {
    "clusters": [
        {"name": "h100", "nodes": {"count": 2, "devices_per_node": 8, "device": "h100"}},
        {"name": "mi300x", "nodes": {"count": 1, "devices_per_node": 4, "device": "mi300x"}},
        {"name": "cpu", "nodes": {"count": 3, "devices_per_node": 2, "device": "cpu"}},
    ],
    "links": {"default": {"bandwidth": "100Gbps", "latency": "2ms"}},
}
BACKEND = {"h100": "cuda", "mi300x": "rocm", "cpu": "cpu"}
NEEDS = ("python3 with hetauto and torch (the same versions on every node)",)


def _plan(*stages: tuple[str, tuple[int, ...], int, int]) -> Plan:
    """stages: (cluster, devices, tp, dp), two layers each."""
    return Plan(model="tiny-gpt", cluster="cluster.yaml", seq_len=32, global_batch=12, microbatch_size=6,
                num_microbatches=2,
                stages=tuple(StagePlan(cluster=c, device_type=c, devices=d, layers=(2 * i, 2 * i + 2), tp=tp, dp=dp)
                             for i, (c, d, tp, dp) in enumerate(stages)))


HETERO = _plan(("h100", tuple(range(16)), 8, 2), ("mi300x", (0, 1, 2, 3), 4, 1))


def _launch(plan: Plan = HETERO, options: dict[str, dict[str, str]] | None = None,
            sites: dict[str, tuple[str, ...]] | None = None) -> LaunchPlan:
    registry = get_registry()
    backends = [BACKEND[s.cluster] for s in plan.stages]
    visible = {b: registry.get(b).visible_devices_envs for b in backends}
    return derive(plan, cluster_from_dict(CLUSTER), {"steps": 10, "seed": 0}, master="10.0.0.1", port=29500,
                  backends=backends, visible_env=visible, sites=sites, site_options=options, needs=NEEDS)


K8S_OPTIONS = {"h100": {"image": "registry.example/hetauto:cuda", "namespace": "training",
                        "node_selector": "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"},
               "mi300x": {"image": "registry.example/hetauto:rocm", "service_account": "trainer"}}
SKY_OPTIONS = {"h100": {"cloud": "aws", "region": "us-east-1", "torch": "2.13.0"},
               "mi300x": {"cloud": "kubernetes", "image_id": "docker:registry.example/hetauto:rocm", "torch": "image"}}


def _check_golden(target: str, files: dict[str, str]) -> None:
    root = GOLDEN / target
    if UPDATE:
        for old in root.rglob("*") if root.is_dir() else ():
            if old.is_file() and old.relative_to(root).as_posix() not in files:
                old.unlink()
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
    on_disk = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert on_disk == sorted(files), "golden files differ from the rendered ones (HETAUTO_UPDATE_GOLDEN=1 rewrites)"
    for rel, text in files.items():
        assert (root / rel).read_text(encoding="utf-8") == text, f"{target}/{rel} differs from its golden file " \
                                                                  "(HETAUTO_UPDATE_GOLDEN=1 rewrites it)"


def _run_script(script: str, tmp_path: Path, env: dict[str, str]) -> tuple[list[str], LaunchPlan]:
    """Run a pod's or node's script with a stand-in python that records its arguments: (agent args, launch.json)."""
    tmp_path.mkdir(parents=True)
    fake = tmp_path / "fake-python"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$HETAUTO_WORKDIR/agent-args"\n')
    fake.chmod(0o755)
    work = tmp_path / "work"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HETAUTO_PYTHON": str(fake),
           "HETAUTO_WORKDIR": str(work), **env}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    args = (work / "agent-args").read_text().split("\n")[:-1]
    return args, LaunchPlan.load(work / "launch.json")


def _rank_of(args: list[str]) -> int:
    assert args[:3] == ["-m", "hetauto", "node"] and args[3] == "launch.json"
    assert args[args.index("--visible-devices") + 1] == "scheduler"
    return int(args[args.index("--node-rank") + 1])


# ----------------------------------------------------------------------------------------------- kubernetes

# kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go (commit 08dfbdfd682714a9ab929633eca8dc95315187e7):
# the json names of JobSet (TypeMeta inline + ObjectMeta + spec), JobSetSpec and ReplicatedJob.
JOBSET_FIELDS = {"apiVersion", "kind", "metadata", "spec", "status"}
JOBSET_SPEC_FIELDS = {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy", "suspend",
                      "coordinator", "managedBy", "ttlSecondsAfterFinished", "volumeClaimPolicies"}
REPLICATED_JOB_FIELDS = {"name", "groupName", "template", "replicas", "dependsOn"}  # template: batchv1.JobTemplateSpec
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _normal(value: Any) -> Any:
    """Scalars as text: the client holds resource quantities as strings (IntOrString in the API)."""
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return str(value)


def _round_trip(data: dict[str, Any], klass: str) -> dict[str, Any]:
    from kubernetes.client import ApiClient

    client = ApiClient()
    model = client._ApiClient__deserialize(data, klass)  # noqa: SLF001 - the client's own model loader
    return client.sanitize_for_serialization(model)


def assert_valid_jobset(doc: dict[str, Any]) -> None:
    assert set(doc) <= JOBSET_FIELDS and doc["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and doc["kind"] == "JobSet"
    assert _normal(_round_trip(doc["metadata"], "V1ObjectMeta")) == _normal(doc["metadata"])
    name = doc["metadata"]["name"]
    assert DNS_1035.match(name), name
    assert set(doc["spec"]) <= JOBSET_SPEC_FIELDS
    jobs = doc["spec"]["replicatedJobs"]
    assert len({j["name"] for j in jobs}) == len(jobs)
    for job in jobs:
        assert set(job) <= REPLICATED_JOB_FIELDS and isinstance(job["replicas"], int) and job["replicas"] >= 1
        assert DNS_1035.match(job["name"]), job["name"]
        template = job["template"]
        # every field of the Job and its pod template is a field of the API: a misspelled one is dropped here
        assert _normal(_round_trip(template, "V1JobTemplateSpec")) == _normal(template)
        assert _normal(_round_trip(template["spec"]["template"], "V1PodTemplateSpec")) == \
            _normal(template["spec"]["template"])
        # pod <jobset>-<job>-<job index>-<pod index>-<5 random>: a DNS-1035 label of at most 63 characters
        spec = template["spec"]
        pod = f"{name}-{job['name']}-{job['replicas'] - 1}-{spec['completions'] - 1}-abcde"
        assert len(pod) <= 63 and DNS_1035.match(pod), pod


def _k8s_files(launch: LaunchPlan) -> dict[str, str]:
    return get_targets(entry_points=False).get("kubernetes").render(launch)


def test_kubernetes_golden_files_for_a_heterogeneous_plan() -> None:
    files = _k8s_files(_launch(options=K8S_OPTIONS))
    assert sorted(files) == ["h100/jobset.yaml", "h100/service.yaml", "mi300x/jobset.yaml"]
    _check_golden("kubernetes", files)


def test_kubernetes_jobsets_are_valid_against_the_api() -> None:
    for rel, text in _k8s_files(_launch(options=K8S_OPTIONS)).items():
        if rel.endswith("jobset.yaml"):
            assert_valid_jobset(yaml.safe_load(text))


def test_the_schema_check_catches_a_misspelled_field() -> None:
    doc = yaml.safe_load(_k8s_files(_launch(options=K8S_OPTIONS))["h100/jobset.yaml"])
    pod = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["nodeSelecter"] = pod.pop("nodeSelector")
    with pytest.raises(AssertionError):
        assert_valid_jobset(doc)
    doc = yaml.safe_load(_k8s_files(_launch(options=K8S_OPTIONS))["h100/jobset.yaml"])
    doc["spec"]["replicatedJobs"][0]["replica"] = 1
    with pytest.raises(AssertionError):
        assert_valid_jobset(doc)


def test_kubernetes_pods_devices_options_and_rendezvous() -> None:
    files = _k8s_files(_launch(options=K8S_OPTIONS))
    h100, mi = (yaml.safe_load(files[f"{s}/jobset.yaml"]) for s in ("h100", "mi300x"))
    assert h100["metadata"]["namespace"] == "training" and "namespace" not in mi["metadata"]
    (job,) = h100["spec"]["replicatedJobs"]
    assert job["replicas"] == 1
    spec = job["template"]["spec"]
    assert (spec["completionMode"], spec["parallelism"], spec["completions"], spec["backoffLimit"]) == \
        ("Indexed", 2, 2, 0)
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"} and "hostNetwork" not in pod
    (c,) = pod["containers"]
    assert c["image"] == "registry.example/hetauto:cuda" and c["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["HETAUTO_FIRST_NODE_RANK"] == "0" and env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500"
    assert [p["containerPort"] for p in c["ports"]] == [29500, 29501]  # the lead serves both
    (job,) = mi["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer" and "nodeSelector" not in pod
    (c,) = pod["containers"]
    assert c["resources"] == {"limits": {"amd.com/gpu": "4"}} and "ports" not in c
    assert {e["name"]: e["value"] for e in c["env"]}["HETAUTO_FIRST_NODE_RANK"] == "2"


def test_every_device_backend_names_its_resource() -> None:
    registry = get_registry()
    assert {b: registry.get(b).device_resource for b in ("cuda", "rocm", "npu", "xpu", "cpu", "mock")} == {
        "cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu", "npu": "huawei.com/Ascend910",
        "xpu": "gpu.intel.com/i915", "cpu": None, "mock": None}


def test_every_device_backend_names_its_interface_variables() -> None:
    """What --iface sets beside GLOO_SOCKET_IFNAME: the variables each collective library reads."""
    registry = get_registry()
    assert {b: registry.get(b).socket_ifname_envs for b in ("cuda", "rocm", "npu", "xpu", "cpu", "mock")} == {
        "cuda": ("NCCL_SOCKET_IFNAME",), "rocm": ("NCCL_SOCKET_IFNAME",), "npu": ("HCCL_SOCKET_IFNAME",),
        "xpu": ("CCL_KVS_IFACE", "FI_TCP_IFACE"), "cpu": (), "mock": ()}


def test_kubernetes_pod_index_gives_each_node_its_rank(tmp_path: Path) -> None:
    """Run each pod's command as Kubernetes would (its env plus JOB_COMPLETION_INDEX): every node rank once, and
    the launch plan it writes is the one rendered."""
    launch = _launch(options=K8S_OPTIONS)
    seen = []
    for rel, text in _k8s_files(launch).items():
        if not rel.endswith("jobset.yaml"):  # the lead's service.yaml
            continue
        for job in yaml.safe_load(text)["spec"]["replicatedJobs"]:
            spec = job["template"]["spec"]
            (c,) = spec["template"]["spec"]["containers"]
            assert c["command"][:2] == ["bash", "-c"]
            for i in range(spec["completions"]):
                env = {e["name"]: e["value"] for e in c["env"]} | {"JOB_COMPLETION_INDEX": str(i)}
                args, written = _run_script(c["command"][2], tmp_path / f"{job['name']}-{i}", env)
                seen.append(_rank_of(args))
                assert written == launch
    assert sorted(seen) == list(range(launch.num_nodes))


def test_kubernetes_groups_split_where_the_process_count_or_cluster_changes(tmp_path: Path) -> None:
    """One site of both vendors, and an H100 cluster whose second node runs 4 processes: three replicatedJobs."""
    plan = _plan(("h100", tuple(range(12)), 4, 3), ("mi300x", (0, 1, 2, 3), 4, 1))
    launch = _launch(plan, options={"all": {"image": "img"}}, sites={"all": ("h100", "mi300x")})
    assert [(len(g.nodes), g.first.nproc, g.first.cluster) for g in node_groups(launch.sites[0])] == \
        [(1, 8, "h100"), (1, 4, "h100"), (1, 4, "mi300x")]
    doc = yaml.safe_load(_k8s_files(launch)["all/jobset.yaml"])
    assert_valid_jobset(doc)
    jobs = doc["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["n0-h100", "n1-h100", "n2-mi300x"]
    limits = [j["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] for j in jobs]
    assert limits == [{"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "4"}, {"amd.com/gpu": "4"}]
    # a cpu cluster of 3 equal nodes: one Indexed Job of 3 pods, no device resource
    cpu = _launch(_plan(("cpu", tuple(range(6)), 2, 3)), options={"cpu": {"image": "img"}})
    doc = yaml.safe_load(_k8s_files(cpu)["cpu/jobset.yaml"])
    assert_valid_jobset(doc)
    (job,) = doc["spec"]["replicatedJobs"]
    assert job["template"]["spec"]["parallelism"] == 3
    assert "resources" not in job["template"]["spec"]["template"]["spec"]["containers"][0]


def test_kubernetes_options_are_checked() -> None:
    target = KubernetesTarget()
    with pytest.raises(HetautoError, match=r"--site-option mi300x\.image=IMAGE"):
        target.render(_launch(options={"h100": {"image": "img"}}))
    with pytest.raises(HetautoError, match=r"unknown kubernetes option 'imgae' \(known: image, namespace, "
                                           r"node_selector, service_account"):
        target.render(_launch(options={"h100": {"image": "i"}, "mi300x": {"image": "i", "imgae": "x"}}))
    with pytest.raises(HetautoError, match="node_selector 'gpu': expected key=value"):
        target.render(_launch(options={"h100": {"image": "i", "node_selector": "gpu"}, "mi300x": {"image": "i"}}))
    ok = target.render(_launch(options={"h100": {"image": "i", "node_selector": "a=1, b=2"}, "mi300x": {"image": "i"}}))
    pod = yaml.safe_load(ok["h100/jobset.yaml"])["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"a": "1", "b": "2"}


# ----------------------------------------------------------------------------------------------- skypilot

# skypilot-org/skypilot sky/utils/schemas.py (skypilot 0.14.1): get_task_schema()["properties"] and
# get_resources_schema()["properties"], both with additionalProperties False.
SKY_TASK_FIELDS = {"name", "workdir", "event_callback", "num_nodes", "resources", "file_mounts", "service", "pool",
                   "setup", "run", "envs", "secrets", "managed_secrets", "inputs", "outputs", "file_mounts_mapping",
                   "config", "volumes", "volume_mounts", "api_server_access", "_metadata"}
SKY_RESOURCES_FIELDS = {"cloud", "region", "zone", "infra", "cpus", "memory", "accelerators", "instance_type",
                        "use_spot", "job_recovery", "volumes", "disk_size", "ephemeral_storage", "disk_tier",
                        "network_tier", "local_disk", "max_hourly_cost", "ports", "labels", "accelerator_args",
                        "image_id", "autostop", "priority", "priority_class", "any_of", "ordered"}
SKY_ENV_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # envs: patternProperties, values string or null
# skypilot-org/skypilot-catalog catalogs/v7/common/accelerators.csv, AcceleratorName column (GPUs)
SKY_ACCELERATOR_NAMES = {
    "A10", "A100", "A100-80GB", "A100-80GB-SXM", "A10G", "A40", "A4000", "A6000", "B200", "GH200", "H100",
    "H100-MEGA", "H100-NVL", "H100-NVLINK", "H100-SXM", "H200", "H200-SXM", "K80", "L4", "L40", "L40S", "M4000", "M60",
    "MI300X", "P100", "P4", "P4000", "RTX3060", "RTX3080", "RTX3090", "RTX4000-Ada", "RTX4060", "RTX4080", "RTX4090",
    "RTX5060", "RTX5090", "RTX6000", "RTX6000-Ada", "RTXA4000", "RTXA4500", "RTXA5000", "RTXA6000", "T4", "T4g",
    "V100", "V100-32GB"}
# catalog devices no SkyPilot cloud offers under any name: a site of them passes --site-option SITE.accelerators
NOT_IN_SKYPILOT = {"ascend-910b", "ascend-910c", "a800-80g", "h20", "h800", "max-1550", "mi250x", "mi325x", "cpu"}


def assert_valid_task(doc: dict[str, Any]) -> None:
    assert set(doc) <= SKY_TASK_FIELDS, set(doc) - SKY_TASK_FIELDS
    assert set(doc["resources"]) <= SKY_RESOURCES_FIELDS, set(doc["resources"]) - SKY_RESOURCES_FIELDS
    assert isinstance(doc["name"], str) and isinstance(doc["num_nodes"], int) and isinstance(doc["run"], str)
    assert all(SKY_ENV_NAME.match(k) and isinstance(v, str) for k, v in doc["envs"].items())
    for key in ("cloud", "region", "zone", "accelerators", "image_id", "cpus"):
        assert isinstance(doc["resources"].get(key, ""), str)
    try:  # SkyPilot's own schema too, where it is installed
        from sky.utils import common_utils, schemas
    except ImportError:
        return
    common_utils.validate_schema(doc, schemas.get_task_schema(), "Invalid task YAML: ")
    common_utils.validate_schema(doc["resources"], schemas.get_resources_schema(), "Invalid resources YAML: ")


def _sky_files(launch: LaunchPlan) -> dict[str, str]:
    return get_targets(entry_points=False).get("skypilot").render(launch)


def test_skypilot_golden_files_for_a_heterogeneous_plan() -> None:
    files = _sky_files(_launch(options=SKY_OPTIONS))
    assert sorted(files) == ["h100/task.yaml", "mi300x/task.yaml"]
    _check_golden("skypilot", files)


def test_skypilot_tasks_are_valid_and_ask_for_the_devices() -> None:
    files = _sky_files(_launch(options=SKY_OPTIONS))
    h100, mi = (yaml.safe_load(files[f"{s}/task.yaml"]) for s in ("h100", "mi300x"))
    for doc in (h100, mi):
        assert_valid_task(doc)
    assert (h100["num_nodes"], h100["resources"]) == (2, {"cloud": "aws", "region": "us-east-1",
                                                          "accelerators": "H100:8", "ports": [29500, 29501]})
    assert (mi["num_nodes"], mi["resources"]) == (1, {"cloud": "kubernetes", "accelerators": "MI300X:4",
                                                      "image_id": "docker:registry.example/hetauto:rocm"})
    assert h100["envs"]["HETAUTO_FIRST_NODE_RANK"] == "0" and mi["envs"]["HETAUTO_FIRST_NODE_RANK"] == "2"
    assert h100["envs"]["MASTER_ADDR"] == "10.0.0.1" and h100["envs"]["MASTER_PORT"] == "29500"


def test_skypilot_node_rank_gives_each_node_its_rank(tmp_path: Path) -> None:
    launch = _launch(options=SKY_OPTIONS)
    seen = []
    for rel, text in _sky_files(launch).items():
        doc = yaml.safe_load(text)
        for i in range(doc["num_nodes"]):
            env = dict(doc["envs"]) | {"SKYPILOT_NODE_RANK": str(i), "SKYPILOT_NUM_NODES": str(doc["num_nodes"])}
            args, written = _run_script(doc["run"], tmp_path / f"{rel.split('/')[0]}-{i}", env)
            seen.append(_rank_of(args))
            assert written == launch
    assert sorted(seen) == list(range(launch.num_nodes))


def test_skypilot_accelerator_table_uses_skypilots_names_for_the_catalog() -> None:
    assert set(SKYPILOT_ACCELERATORS.values()) <= SKY_ACCELERATOR_NAMES
    # every catalog device is either named or known to be absent from SkyPilot (a new device must pick one)
    assert set(SKYPILOT_ACCELERATORS) | NOT_IN_SKYPILOT == set(catalog())
    assert not set(SKYPILOT_ACCELERATORS) & NOT_IN_SKYPILOT


def test_skypilot_refuses_unequal_nodes_and_unknown_devices() -> None:
    target = SkyPilotTarget()
    both = _launch(sites={"all": ("h100", "mi300x")})
    with pytest.raises(HetautoError, match=r"site 'all': a SkyPilot task runs equal nodes .*"
                                           r"--site all-h100=h100 --site all-mi300x=mi300x"):
        target.render(both)
    uneven = _launch(_plan(("h100", tuple(range(12)), 4, 3), ("mi300x", (0, 1, 2, 3), 4, 1)))
    with pytest.raises(HetautoError, match="different number of devices on the nodes of cluster h100"):
        target.render(uneven)
    h800 = {"name": "h800", "nodes": {"count": 1, "devices_per_node": 8, "device": "h800"}}
    cluster = {**CLUSTER, "clusters": [*CLUSTER["clusters"], h800]}
    plan = _plan(("h100", tuple(range(8)), 8, 1), ("h800", tuple(range(8)), 8, 1))
    launch = derive(plan, cluster_from_dict(cluster), {}, master="10.0.0.1", backends=["cuda", "cuda"],
                    visible_env={"cuda": ("CUDA_VISIBLE_DEVICES",)})
    with pytest.raises(HetautoError, match=r"device 'h800'; pass --site-option h800\.accelerators=NAME:8"):
        target.render(launch)
    named = derive(plan, cluster_from_dict(cluster), {}, master="10.0.0.1", backends=["cuda", "cuda"],
                   visible_env={"cuda": ("CUDA_VISIBLE_DEVICES",)}, site_options={"h800": {"accelerators": "H800"}})
    doc = yaml.safe_load(target.render(named)["h800/task.yaml"])
    assert doc["resources"]["accelerators"] == "H800:8"
    bad = derive(plan, cluster_from_dict(cluster), {}, master="10.0.0.1", backends=["cuda", "cuda"],
                 visible_env={"cuda": ("CUDA_VISIBLE_DEVICES",)}, site_options={"h800": {"accelerators": "H800:4"}})
    with pytest.raises(HetautoError, match="each node runs 8 process"):
        target.render(bad)
    with pytest.raises(HetautoError, match=r"unknown skypilot option 'image' \(known: cloud, region, zone, "
                                           r"accelerators, image_id"):
        target.render(_launch(options={"h100": {"image": "x"}}))


def test_skypilot_cpu_site_asks_for_cpus() -> None:
    launch = _launch(_plan(("cpu", tuple(range(6)), 2, 3)))
    doc = yaml.safe_load(SkyPilotTarget().render(launch)["cpu/task.yaml"])
    assert_valid_task(doc)
    assert doc["num_nodes"] == 3 and doc["resources"] == {"cpus": "2+"}


def test_launch_json_is_embedded_verbatim() -> None:
    """The here-document carries the launch plan's one-line JSON unchanged through YAML."""
    launch = _launch(options={**K8S_OPTIONS})
    doc = yaml.safe_load(_k8s_files(launch)["h100/jobset.yaml"])
    script = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    body = script.split("<<'HETAUTO_LAUNCH_JSON'\n", 1)[1].split("\nHETAUTO_LAUNCH_JSON\n", 1)[0]
    assert json.loads(body) == json.loads(launch.to_json())


# ------------------------------------------------------------------------- submittable unedited (issue 41 item 5)


def _with_checkpoints(options: dict[str, dict[str, str]], folder: str = "/checkpoints") -> LaunchPlan:
    registry = get_registry()
    backends = [BACKEND[s.cluster] for s in HETERO.stages]
    return derive(HETERO, cluster_from_dict(CLUSTER), {"steps": 10, "checkpoint_dir": folder}, master="10.0.0.1",
                  backends=backends, visible_env={b: registry.get(b).visible_devices_envs for b in backends},
                  site_options=options, needs=NEEDS)


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_kubernetes_lead_service_is_valid_and_selects_node_rank_0() -> None:
    files = _k8s_files(_launch(options=K8S_OPTIONS))
    assert sorted(files) == ["h100/jobset.yaml", "h100/service.yaml", "mi300x/jobset.yaml"]  # the lead site's only
    svc = yaml.safe_load(files["h100/service.yaml"])
    assert _normal(_round_trip(svc, "V1Service")) == _normal(svc)
    jobset = yaml.safe_load(files["h100/jobset.yaml"])
    labels = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
    assert svc["metadata"]["namespace"] == "training" and svc["spec"]["clusterIP"] == "None"  # headless by default
    assert svc["spec"]["selector"] == {"jobset.sigs.k8s.io/jobset-name": jobset["metadata"]["name"],
                                       "hetauto/node-group": labels["hetauto/node-group"],
                                       "batch.kubernetes.io/job-completion-index": "0"}
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(29500, 29500), (29501, 29501)]
    assert "kubectl apply -f secret.yaml -f service.yaml -f jobset.yaml" in files["h100/jobset.yaml"]


@pytest.mark.parametrize("kind, fields", [("loadbalancer", {"type": "LoadBalancer", "loadBalancerIP": "10.0.0.1"}),
                                          ("clusterip", {"type": "ClusterIP", "clusterIP": "10.0.0.1"})])
def test_kubernetes_service_with_a_fixed_address(kind: str, fields: dict[str, str]) -> None:
    options = {"h100": {**K8S_OPTIONS["h100"], "service": kind}, "mi300x": K8S_OPTIONS["mi300x"]}
    svc = yaml.safe_load(_k8s_files(_launch(options=options))["h100/service.yaml"])
    assert _normal(_round_trip(svc, "V1Service")) == _normal(svc)
    assert {k: svc["spec"][k] for k in fields} == fields


def test_kubernetes_service_none_nodeport_and_host_network() -> None:
    options = {"h100": {**K8S_OPTIONS["h100"], "service": "none", "network": "host"}, "mi300x": K8S_OPTIONS["mi300x"]}
    files = _k8s_files(_launch(options=options))
    assert "h100/service.yaml" not in files
    pod = _pod(yaml.safe_load(files["h100/jobset.yaml"]))
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert_valid_jobset(yaml.safe_load(files["h100/jobset.yaml"]))
    with pytest.raises(HetautoError, match="outside Kubernetes' NodePort range 30000-32767"):
        _k8s_files(_launch(options={"h100": {**K8S_OPTIONS["h100"], "service": "nodeport"},
                                    "mi300x": K8S_OPTIONS["mi300x"]}))
    with pytest.raises(HetautoError, match="option network 'flat' is not one of pod, host"):
        _k8s_files(_launch(options={"h100": {**K8S_OPTIONS["h100"], "network": "flat"},
                                    "mi300x": K8S_OPTIONS["mi300x"]}))


def test_kubernetes_job_secret_is_a_secret_the_pods_mount() -> None:
    launch = _launch(options=K8S_OPTIONS)
    target = KubernetesTarget()
    secrets = target.render_secrets(launch, "s" * 64)
    assert sorted(secrets) == ["h100/secret.yaml", "mi300x/secret.yaml"]
    for site, text in secrets.items():
        doc = yaml.safe_load(text)
        assert _normal(_round_trip(doc, "V1Secret")) == _normal(doc)
        assert doc["stringData"] == {"control.secret": "s" * 64}
        pod = _pod(yaml.safe_load(target.render(launch)[site.replace("secret", "jobset")]))
        (volume,) = [v for v in pod["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == doc["metadata"]["name"]
        (c,) = pod["containers"]
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
        env = {e["name"]: e["value"] for e in c["env"]}
        assert mount["readOnly"] and env["HETAUTO_SECRET_FILE"] == f"{mount['mountPath']}/control.secret"
    assert all("s" * 64 not in text for text in target.render(launch).values())


def test_kubernetes_checkpoint_volume_and_cancel_policy() -> None:
    from hetauto.launch.job_board import CANCELLED_EXIT

    with pytest.raises(HetautoError, match=r"site 'h100': the launch writes checkpoints to /checkpoints.*"
                                           r"--site-option h100\.checkpoint_pvc=NAME"):
        _k8s_files(_with_checkpoints(K8S_OPTIONS))
    options = {s: {**o, "checkpoint_pvc": "ck-claim"} for s, o in K8S_OPTIONS.items()}
    with pytest.raises(HetautoError, match="--checkpoint-dir ck: the kubernetes target mounts the volume there"):
        _k8s_files(_with_checkpoints(options, "ck"))
    for text in _k8s_files(_with_checkpoints(options)).values():
        doc = yaml.safe_load(text)
        if doc["kind"] != "JobSet":
            continue
        assert_valid_jobset(doc)
        pod = _pod(doc)
        (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claim["persistentVolumeClaim"] == {"claimName": "ck-claim"}
        assert {"name": claim["name"], "mountPath": "/checkpoints"} in pod["containers"][0]["volumeMounts"]
        policy = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]
        assert policy["rules"] == [{"action": "FailJob", "onExitCodes": {"containerName": "hetauto", "operator": "In",
                                                                         "values": [CANCELLED_EXIT]}}]


def test_launch_writes_the_kubernetes_secret_apart_owner_only(tmp_path: Path) -> None:
    from hetauto.cli import main
    from hetauto.testing.two_sites import write_two_site_plan

    plan = write_two_site_plan(tmp_path, slow_ranks=1)
    out = tmp_path / "out"
    assert main(["launch", str(plan), "--target", "kubernetes", "--master", "10.0.0.1", "-o", str(out),
                 "--site-option", "fast.image=img", "--site-option", "slow.image=img"]) == 0
    secret = (out / "control.secret").read_text().strip()
    for site in ("fast", "slow"):
        path = out / site / "secret.yaml"
        assert path.stat().st_mode & 0o777 == 0o600
        assert yaml.safe_load(path.read_text())["stringData"]["control.secret"] == secret
        assert secret not in (out / site / "jobset.yaml").read_text()
    assert (out / "fast" / "service.yaml").is_file() and not (out / "slow" / "service.yaml").exists()
    readme = (out / "README.txt").read_text()
    assert ("site 'slow' (clusters slow): submit slow/secret.yaml (the job secret, owner-only) first, then "
            "slow/jobset.yaml\n") in readme, readme


# skypilot 0.14.1: sky/utils/schemas.py get_storage_schema()["properties"] (additionalProperties False), the value of
# a file_mounts entry that is a bucket, and sky/data/storage.py StorageMode
SKY_STORAGE_FIELDS = {"name", "source", "store", "persistent", "mode", "type", "config"}
SKY_STORAGE_MODES = {"MOUNT", "COPY", "MOUNT_CACHED"}


def test_skypilot_checkpoint_volume_is_a_bucket_or_a_skypilot_volume() -> None:
    with pytest.raises(HetautoError, match=r"site 'h100': the launch writes checkpoints to /checkpoints, and a node's "
                                           r"disk is gone with `sky down`: pass --site-option h100\.checkpoint_bucket="
                                           r"URL .* or --site-option h100\.checkpoint_volume=NAME"):
        _sky_files(_with_checkpoints(SKY_OPTIONS))
    bucket = {"h100": {**SKY_OPTIONS["h100"], "checkpoint_bucket": "s3://ck-bucket/job"},
              "mi300x": {**SKY_OPTIONS["mi300x"], "checkpoint_volume": "ck-pvc"}}
    h100, mi = (yaml.safe_load(text) for text in _sky_files(_with_checkpoints(bucket)).values())
    for doc in (h100, mi):
        assert_valid_task(doc)
    mount = h100["file_mounts"]["/checkpoints"]  # MOUNT_CACHED: MOUNT's S3 driver cannot rename a full folder
    assert mount == {"source": "s3://ck-bucket/job", "mode": "MOUNT_CACHED"} and "volumes" not in h100
    assert set(mount) <= SKY_STORAGE_FIELDS and mount["mode"] in SKY_STORAGE_MODES
    assert mi["volumes"] == {"/checkpoints": "ck-pvc"} and "/checkpoints" not in mi["file_mounts"]
    for doc in (h100, mi):  # the secret is still copied beside the volume
        assert list(doc["file_mounts"].values())[0] == "control.secret"
    with pytest.raises(HetautoError, match="--checkpoint-dir ck: the skypilot target mounts the checkpoint volume"):
        _sky_files(_with_checkpoints(bucket, "ck"))
    both = {**bucket, "h100": {**bucket["h100"], "checkpoint_volume": "v"}}
    with pytest.raises(HetautoError, match="site 'h100': options checkpoint_bucket and checkpoint_volume both"):
        _sky_files(_with_checkpoints(both))
    not_url = {**bucket, "h100": {**SKY_OPTIONS["h100"], "checkpoint_bucket": "ck-bucket"}}
    with pytest.raises(HetautoError, match="checkpoint_bucket 'ck-bucket' is not a bucket URL"):
        _sky_files(_with_checkpoints(not_url))
    with pytest.raises(HetautoError, match="option checkpoint_bucket is given but the launch writes no checkpoints"):
        _sky_files(_launch(options=bucket))


def test_skypilot_setup_ports_and_secret_mount() -> None:
    from hetauto import __version__

    files = _sky_files(_launch(options=SKY_OPTIONS))
    h100, mi = (yaml.safe_load(files[f"{s}/task.yaml"]) for s in ("h100", "mi300x"))
    assert f'pip install "hetauto[cuda]=={__version__}" "torch==2.13.0"' in h100["setup"]
    assert mi["setup"].rstrip().endswith(f'pip install "hetauto[rocm]=={__version__}"')  # torch=image: the image's
    assert "ports" not in mi["resources"]  # only the lead site opens the rendezvous and control ports
    for doc in (h100, mi):
        ((remote, local),) = doc["file_mounts"].items()
        assert local == "control.secret" and remote.endswith("/control.secret")
        assert f'HETAUTO_SECRET_FILE="${{HETAUTO_SECRET_FILE:-$HOME/{remote.removeprefix("~/")}}}"' in doc["run"]
    from importlib import metadata

    default = yaml.safe_load(_sky_files(_launch(options={"h100": {}, "mi300x": {}}))["h100/task.yaml"])
    assert f'"torch=={metadata.version("torch").split("+")[0]}"' in default["setup"]
    with pytest.raises(HetautoError, match="option torch '2.13; rm' is not a version"):
        _sky_files(_launch(options={"h100": {"torch": "2.13; rm"}, "mi300x": {}}))
