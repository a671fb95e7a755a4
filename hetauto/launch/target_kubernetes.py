"""The `kubernetes` launch target: one JobSet (`jobset.x-k8s.io/v1alpha2`) per site, `<site>/jobset.yaml`, to
`kubectl apply -f` on that site's cluster (the JobSet controller must be installed there).

One replicatedJob per *node group*: consecutive node ranks of one plan cluster with the same process count and
device (a cluster whose plan uses 8 devices of one node and 4 of the next gives two groups). A group of N nodes is
one Indexed Job (`replicas: 1`, `parallelism = completions = N`): JobSet's own PyTorch examples
(site/static/examples/pytorch/cnn-mnist/mnist.yaml in kubernetes-sigs/jobset) run torchrun-style multi-node
training exactly so, with the pod's completion index as torchrun's node rank, and JobSet's webhook defaults every
replicatedJob to Indexed completion for it. So pod i of a group runs node rank `first node rank of the group + i`
(`$JOB_COMPLETION_INDEX`, which Kubernetes sets in every container of an Indexed Job's pod).

(`replicas: N` Jobs of one pod each would number nodes by the JobSet's job-index label instead; nothing gains.)

Each pod writes the launch plan from a quoted here-document in its own command (`bash -c`) and starts the node
agent, as the torchrun and slurm artifacts do. Not a ConfigMap: the file stays one object that `kubectl apply`
creates in one step, with nothing left behind or shared by name between two launches, and no ConfigMap rights
needed; the plan is a few kB (a ConfigMap would hold at most 1 MiB anyway). The scheduler's device plugin gives
the pod its devices (`<backend's device resource>: nproc` limits), so the agent runs with `--visible-devices
scheduler`.

What makes the files submittable unedited (issue 41 item 5), given an image, the lead's address and a volume:
- the lead site's `service.yaml`: a Service in front of the lead pod (node rank 0: the lead group's pod of
  completion index 0) on the rendezvous and control ports. `service=headless` (default: in-cluster DNS, for a
  master address that routes to the pod, e.g. a flat multi-cluster network), `clusterip` or `loadbalancer` (the
  master address, when it is an IP, is the Service's fixed clusterIP or loadBalancerIP: an address known before the
  lead pod exists), `nodeport`, or `none` (no Service: with `network=host`, the lead node's own address).
- `network=pod` (default: the cluster's pod network, which must route between the sites) or `host` (hostNetwork:
  the pods use their nodes' addresses, dnsPolicy ClusterFirstWithHostNet).
- `checkpoint_pvc=NAME`: a PersistentVolumeClaim mounted at the launch's --checkpoint-dir (required when the launch
  has one: a pod's own disk is gone with the pod, and a site submitted again resumes from that folder).
- the job secret as a Kubernetes Secret, `<site>/secret.yaml` (written with the secret beside the site's
  control.secret, mode 0600 like every file of the launch: `render_secrets`, never in jobset.yaml), mounted
  read-only (0400) into every pod and named by HETAUTO_SECRET_FILE.
- a podFailurePolicy that fails the Job at once on CANCELLED_EXIT (`hetauto job cancel`): a cancelled job is
  never restarted, whatever backoffLimit an operator sets.

Site options (`--site-option SITE.KEY=VALUE`): `image` (required: a container image with python3, torch for the
backend, and hetauto), `namespace`, `node_selector` (`key=value[,key=value...]`), `service_account`, `network`,
`service`, `checkpoint_pvc`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


from hetauto.core.errors import HetautoError
from hetauto.launch.job_board import CANCELLED_EXIT
from hetauto.launch.node_secret import SECRET_FILE, SECRET_FILE_ENV
from hetauto.launch.plan import LaunchPlan, NodeLaunch, SiteLaunch
from hetauto.launch.targets import dump_yaml, embedded_launch, hookimpl, node_command, one_line, site_header

__all__ = ["KubernetesTarget", "NodeGroup", "node_groups", "jobset", "jobset_path", "dump_yaml", "OPTIONS",
           "API_VERSION", "service", "secret", "secret_name", "SECRET_DIR"]

API_VERSION = "jobset.x-k8s.io/v1alpha2"
OPTIONS = ("image", "namespace", "node_selector", "service_account", "network", "service", "checkpoint_pvc")
NETWORKS = ("pod", "host")
SERVICES = ("headless", "clusterip", "loadbalancer", "nodeport", "none")
SECRET_DIR = "/var/run/hetauto"  # where each pod finds the job secret's file (the Secret's one key)
CONTAINER = "hetauto"
# Kubernetes sets it in each container of an Indexed Job's pods (batch/v1 Job, completionMode: Indexed)
INDEX_ENV = "JOB_COMPLETION_INDEX"
NODE_RANK = '"$HETAUTO_NODE_RANK"'  # the node agent's --node-rank, as shell text
# A pod is named <jobset>-<replicatedJob>-<job index>-<pod index>-<5 random>, a DNS-1035 label of at most 63
# characters (JobSet's webhook refuses the JobSet otherwise): the two names get 30 and 15 characters, the rest
# fits "-0-999-abcde".
_JOBSET_NAME_MAX, _GROUP_NAME_MAX = 30, 15


@dataclass(frozen=True)
class NodeGroup:
    """Consecutive node ranks of one cluster with one process count and device: one replicatedJob."""

    nodes: tuple[NodeLaunch, ...]

    @property
    def first(self) -> NodeLaunch:
        return self.nodes[0]

    @property
    def name(self) -> str:
        first = self.first
        return _dns_label(f"n{first.node_rank}-{first.cluster}", _GROUP_NAME_MAX)


def node_groups(site: SiteLaunch) -> list[NodeGroup]:
    groups: list[list[NodeLaunch]] = []
    for n in sorted(site.nodes, key=lambda n: n.node_rank):
        last = groups[-1][-1] if groups else None
        if (last is not None and n.node_rank == last.node_rank + 1 and n.cluster == last.cluster
                and n.nproc == last.nproc and n.backend == last.backend and n.device_type == last.device_type):
            groups[-1].append(n)
        else:
            groups.append([n])
    return [NodeGroup(tuple(g)) for g in groups]


def jobset_path(site: SiteLaunch) -> str:
    return f"{site.name}/jobset.yaml"


def jobset_name(launch: LaunchPlan, site: SiteLaunch) -> str:
    return f"{_dns_label(f'hetauto-{site.name}', _JOBSET_NAME_MAX - 9)}-{launch.plan_sha256[:8]}"


def _dns_label(text: str, limit: int) -> str:
    """Lower-case letters, digits and '-', starting with a letter and ending with a letter or digit."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"x-{label}"
    return label[:limit].rstrip("-")


def _options(site: SiteLaunch) -> dict[str, str]:
    unknown = sorted(set(site.options) - set(OPTIONS))
    if unknown:
        raise HetautoError(f"site '{site.name}': unknown kubernetes option '{unknown[0]}' (known: "
                           f"{', '.join(OPTIONS)}; pass them as --site-option {site.name}.KEY=VALUE)")
    opts = {k: v.strip() for k, v in site.options.items()}
    if not opts.get("image"):
        raise HetautoError(f"site '{site.name}': the kubernetes target needs a container image (python3, torch for "
                           f"the site's backend, hetauto): pass --site-option {site.name}.image=IMAGE")
    for key, known in (("network", NETWORKS), ("service", SERVICES)):
        if key in opts and opts[key] not in known:
            raise HetautoError(f"site '{site.name}': option {key} {opts[key]!r} is not one of {', '.join(known)} "
                               f"(--site-option {site.name}.{key}=VALUE)")
    if "checkpoint_pvc" in opts and not _K8S_NAME["service_account"].fullmatch(opts["checkpoint_pvc"]):
        raise HetautoError(f"site '{site.name}': option checkpoint_pvc {opts['checkpoint_pvc']!r} is not a Kubernetes "
                           "name (a PersistentVolumeClaim's: lower-case letters, digits, '-' and '.')")
    for key in ("namespace", "service_account"):
        if key in opts and not opts[key]:
            raise HetautoError(f"site '{site.name}': option {key} is empty (--site-option {site.name}.{key}=NAME)")
        if key in opts and not _K8S_NAME[key].fullmatch(opts[key]):
            raise HetautoError(f"site '{site.name}': option {key} {opts[key]!r} is not a Kubernetes name (lower-case "
                               "letters, digits and '-', starting and ending with a letter or digit); kubectl would "
                               "refuse the JobSet")
    return opts


# namespace: an RFC 1123 label; service account: an RFC 1123 subdomain (dots allowed)
_K8S_NAME = {"namespace": re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"),
             "service_account": re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")}


def _node_selector(site: SiteLaunch, text: str) -> dict[str, str]:
    selector: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise HetautoError(f"site '{site.name}': node_selector {text!r}: expected key=value[,key=value...] "
                               f"(e.g. --site-option {site.name}.node_selector=nvidia.com/gpu.product=H100)")
        selector[key.strip()] = value.strip()
    return selector


def _device_resource(site: SiteLaunch, backend: str) -> str | None:
    """The extended resource the backend's device plugin advertises (nvidia.com/gpu ...); None: cpu, mock."""
    from hetauto.backends import get_registry

    registry = get_registry()
    if backend not in registry:
        raise HetautoError(f"site '{site.name}': backend '{backend}' is not registered where hetauto launch runs, so "
                           "its Kubernetes device resource is unknown; install its plugin here (hetauto backends "
                           "lists the registered ones)")
    return registry.get(backend).device_resource


def _script(launch: LaunchPlan, group: NodeGroup) -> str:
    first, count = group.first, len(group.nodes)
    ranks = f"node rank {first.node_rank}" if count == 1 else \
        f"node ranks {first.node_rank}-{first.node_rank + count - 1} (pod i: node rank {first.node_rank} + i)"
    return (
        f"# hetauto launch (kubernetes): cluster '{one_line(first.cluster)}', {ranks} of {launch.num_nodes}; "
        f"{first.nproc} process(es) per node, backend {one_line(first.backend)}\n"
        "set -euo pipefail\n"
        f'export HETAUTO_NODE_RANK=$((HETAUTO_FIRST_NODE_RANK + ${{{INDEX_ENV}:?not an Indexed Job pod}}))\n'
        f'work="${{HETAUTO_WORKDIR:-/tmp/hetauto-job-{launch.plan_sha256[:12]}}}"\n'
        'mkdir -p "$work"\n'
        'cd "$work"\n'
        + embedded_launch(launch)
        + f"exec {node_command(NODE_RANK, devices='scheduler')}\n"
    )


def secret_name(launch: LaunchPlan, site: SiteLaunch) -> str:
    """The Kubernetes Secret holding the job secret on this site's cluster (secret.yaml)."""
    return f"{jobset_name(launch, site)}-secret"


def _checkpoint_dir(launch: LaunchPlan, site: SiteLaunch, opts: dict[str, str]) -> str | None:
    """The launch's --checkpoint-dir, which the site's pods mount from `checkpoint_pvc` (None: no checkpoints)."""
    folder = launch.run_config().checkpoint.dir
    if not folder:
        if "checkpoint_pvc" in opts:
            raise HetautoError(f"site '{site.name}': option checkpoint_pvc is given but the launch writes no "
                               "checkpoints; pass --checkpoint-dir /ABSOLUTE/PATH (where the pods mount the volume)")
        return None
    if "checkpoint_pvc" not in opts:
        raise HetautoError(f"site '{site.name}': the launch writes checkpoints to {folder}, and a pod's own disk is "
                           f"gone with the pod: pass --site-option {site.name}.checkpoint_pvc=NAME, the "
                           "PersistentVolumeClaim to mount there")
    if not folder.startswith("/"):
        raise HetautoError(f"--checkpoint-dir {folder}: the kubernetes target mounts the volume there, so give an "
                           "absolute path (e.g. /checkpoints)")
    return folder


def _volumes(launch: LaunchPlan, site: SiteLaunch, opts: dict[str, str]) -> tuple[list[Any], list[Any]]:
    """(the pod's volumes, the container's mounts): the job secret (read-only) and the checkpoint volume."""
    volumes: list[Any] = [{"name": "job-secret", "secret": {"secretName": secret_name(launch, site),
                                                             "defaultMode": 0o440}}]
    mounts: list[Any] = [{"name": "job-secret", "mountPath": SECRET_DIR, "readOnly": True}]
    folder = _checkpoint_dir(launch, site, opts)
    if folder is not None:
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": opts["checkpoint_pvc"]}})
        mounts.append({"name": "checkpoints", "mountPath": folder})
    return volumes, mounts


def _pod_template(launch: LaunchPlan, site: SiteLaunch, group: NodeGroup, opts: dict[str, str]) -> dict[str, Any]:
    first, rdzv = group.first, launch.rendezvous
    env = [{"name": "HETAUTO_FIRST_NODE_RANK", "value": str(first.node_rank)},
           {"name": "MASTER_ADDR", "value": rdzv.master_addr},
           {"name": "MASTER_PORT", "value": str(rdzv.master_port)},
           {"name": SECRET_FILE_ENV, "value": f"{SECRET_DIR}/{SECRET_FILE}"},
           {"name": "PYTHONUNBUFFERED", "value": "1"}]
    volumes, mounts = _volumes(launch, site, opts)
    container: dict[str, Any] = {"name": CONTAINER, "image": opts["image"],
                                 "command": ["bash", "-c", _script(launch, group)], "env": env,
                                 "volumeMounts": mounts}
    if first.node_rank == 0:  # the lead: torchrun's static rendezvous and the control store listen here
        container["ports"] = [{"name": "rendezvous", "containerPort": rdzv.master_port, "protocol": "TCP"},
                              {"name": "control", "containerPort": rdzv.control_port, "protocol": "TCP"}]
    resource = _device_resource(site, first.backend)
    if resource is not None:  # a Quantity's canonical form is a string ("8"): the API and every client take it
        container["resources"] = {"limits": {resource: str(first.nproc)}}
    # a static rendezvous cannot take a restarted node back: a failed pod fails its Job and so the JobSet
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container], "volumes": volumes}
    if opts.get("network") == "host":  # the pods use their nodes' addresses (and still resolve the cluster's names)
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if "node_selector" in opts:
        spec["nodeSelector"] = _node_selector(site, opts["node_selector"])
    if "service_account" in opts:
        spec["serviceAccountName"] = opts["service_account"]
    return {"metadata": {"labels": {"app.kubernetes.io/name": "hetauto",
                                    "hetauto/node-group": group.name}},
            "spec": spec}


def jobset(launch: LaunchPlan, site: SiteLaunch) -> dict[str, Any]:
    """The JobSet of one site, as the dict that is written as YAML."""
    opts = _options(site)
    metadata: dict[str, Any] = {"name": jobset_name(launch, site)}
    if "namespace" in opts:
        metadata["namespace"] = opts["namespace"]
    metadata["labels"] = {"app.kubernetes.io/name": "hetauto"}
    metadata["annotations"] = {"hetauto/site": site.name, "hetauto/plan-sha256": launch.plan_sha256}
    jobs = []
    for group in node_groups(site):
        count = len(group.nodes)
        jobs.append({
            "name": group.name,
            "replicas": 1,
            "template": {"spec": {
                "completionMode": "Indexed",
                "parallelism": count,
                "completions": count,
                "backoffLimit": 0,
                # a cancelled job (hetauto job cancel) fails at once, never restarted, whatever the backoffLimit
                "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                    "containerName": CONTAINER, "operator": "In", "values": [CANCELLED_EXIT]}}]},
                "template": _pod_template(launch, site, group, opts),
            }},
        })
    return {"apiVersion": API_VERSION, "kind": "JobSet", "metadata": metadata, "spec": {"replicatedJobs": jobs}}


def _ip(text: str) -> str | None:
    import ipaddress

    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def service(launch: LaunchPlan, site: SiteLaunch) -> dict[str, Any] | None:
    """The lead site's Service in front of the lead pod (node rank 0) on the rendezvous and control ports; None
    on the other sites or with `service=none`."""
    opts, rdzv = _options(site), launch.rendezvous
    kind = opts.get("service", "headless")
    if site.name != rdzv.lead_site or kind == "none":
        return None
    name = jobset_name(launch, site)
    selector = {"jobset.sigs.k8s.io/jobset-name": name, "hetauto/node-group": node_groups(site)[0].name,
                "batch.kubernetes.io/job-completion-index": "0"}  # set on Indexed Job pods (Kubernetes 1.28+)
    ports = [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"}
             for n, p in (("rendezvous", rdzv.master_port), ("control", rdzv.control_port))]
    spec: dict[str, Any] = {"selector": selector, "ports": ports, "publishNotReadyAddresses": True}
    fixed = _ip(rdzv.master_addr)
    if kind == "headless":
        spec["clusterIP"] = "None"
    elif kind == "clusterip":
        spec.update({"type": "ClusterIP", **({"clusterIP": fixed} if fixed else {})})
    elif kind == "loadbalancer":
        spec.update({"type": "LoadBalancer", **({"loadBalancerIP": fixed} if fixed else {})})
    else:
        spec["type"] = "NodePort"
        if not all(30000 <= p["port"] <= 32767 for p in ports):
            raise HetautoError(f"site '{site.name}': service nodeport opens the node's ports {rdzv.master_port} and "
                               f"{rdzv.control_port}, outside Kubernetes' NodePort range 30000-32767: pass --master "
                               "HOST:PORT with PORT in 30000-32766")
        for p in ports:
            p["nodePort"] = p["port"]
    meta: dict[str, Any] = {"name": f"{name}-lead", "labels": {"app.kubernetes.io/name": "hetauto"}}
    if "namespace" in opts:
        meta = {"name": meta["name"], "namespace": opts["namespace"], "labels": meta["labels"]}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def secret(launch: LaunchPlan, site: SiteLaunch, value: str) -> dict[str, Any]:
    """The job secret as a Kubernetes Secret on this site's cluster (its pods mount it at SECRET_DIR)."""
    meta: dict[str, Any] = {"name": secret_name(launch, site)}
    opts = _options(site)
    if "namespace" in opts:
        meta["namespace"] = opts["namespace"]
    meta["labels"] = {"app.kubernetes.io/name": "hetauto"}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "stringData": {SECRET_FILE: value}}


def _header(launch: LaunchPlan, site: SiteLaunch) -> str:
    rdzv = launch.rendezvous
    lead = site.name == rdzv.lead_site
    lead_job = node_groups(site)[0].name
    has_service = lead and service(launch, site) is not None
    role = (f"the lead site: the first pod of {lead_job} (node rank 0) serves the rendezvous ({rdzv.master_port}) "
            f"and the control store ({rdzv.control_port});\n# {rdzv.master_addr} must reach that pod on both ports "
            "from every site" + (" (service.yaml puts a Service in front of it)" if has_service else "") if lead else
            f"its pods join the lead at {rdzv.master_addr} ports {rdzv.master_port} and {rdzv.control_port}")
    files = "-f secret.yaml " + ("-f service.yaml " if has_service else "") + "-f jobset.yaml"
    return site_header("kubernetes", launch, site, role,
                       "# Pods talk to pods of the other sites directly (the collectives): their addresses must be "
                       "routable\n# between the sites (or network=host). Submit with: kubectl apply "
                       f"{files}\n# (the JobSet controller must be installed; secret.yaml holds the job secret: "
                       "keep it 0600)\n")


class KubernetesTarget:
    name = "kubernetes"
    summary = "one JobSet per site (one Indexed Job per node group); kubectl apply -f SITE/jobset.yaml"

    def render(self, launch: LaunchPlan) -> dict[str, str]:
        files = {}
        for s in launch.sites:
            files[jobset_path(s)] = _header(launch, s) + dump_yaml(jobset(launch, s))
            lead = service(launch, s)
            if lead is not None:
                files[f"{s.name}/service.yaml"] = dump_yaml(lead)
        return files

    def render_secrets(self, launch: LaunchPlan, value: str) -> dict[str, str]:
        """The files that hold the job secret (written apart, mode 0600, by hetauto launch): a Secret per site."""
        return {f"{s.name}/secret.yaml": dump_yaml(secret(launch, s, value)) for s in launch.sites}


@hookimpl
def hetauto_launch_targets(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(KubernetesTarget())
