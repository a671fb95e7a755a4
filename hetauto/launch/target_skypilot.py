"""The `skypilot` launch target: one SkyPilot task per site, `<site>/task.yaml`, to `sky launch` there.

A SkyPilot task is one cluster of `num_nodes` equal nodes (one `resources`), so a site must be equal nodes: one
process count and one device. A site whose nodes differ is refused with the `--site` that splits it. The task's
`run` writes the launch plan from a quoted here-document and starts the node agent on every node with node rank
= the site's first node rank + `$SKYPILOT_NODE_RANK` (0 on SkyPilot's head node), so a site's node ranks must be
consecutive (they are, unless a site joins clusters the plan interleaves). SkyPilot gives each node its devices,
hence `--visible-devices scheduler`.

`resources.accelerators` is `NAME:nproc` with NAME SkyPilot's accelerator name for the node's device profile
(`SKYPILOT_ACCELERATORS`, checked against SkyPilot's accelerator catalog, skypilot-org/skypilot-catalog
catalogs/v7/common/accelerators.csv); cpu and mock sites ask for `cpus: "<nproc>+"` instead. Site options
(`--site-option SITE.KEY=VALUE`): `cloud`, `region`, `zone`, `image_id`, and `accelerators` (`NAME[:COUNT]`, for
a device the table lacks or another name, e.g. A100-80GB-SXM; COUNT must be the node's process count), `torch`,
`checkpoint_bucket`, `checkpoint_volume`.

What makes a task submittable unedited (issue 41 item 5), given the lead's address:
- `setup:` installs this hetauto, with the backend's extra, and torch pinned to the version hetauto launch ran with
  (every node must run the same versions: the join checks them); `torch=VERSION` pins another, `torch=image`
  keeps the image's torch (an `image_id` built for the job).
- `resources.ports`: the lead site's task opens the rendezvous and control ports to the other sites (a launch of
  one site keeps them inside its cluster).
- `file_mounts`: the site's control.secret (beside task.yaml: run `sky launch` in the site's folder) is copied to
  each node and named by HETAUTO_SECRET_FILE (its mode set to 0600 there); the secret is never in the task's text.
- the checkpoint volume, at the launch's (absolute) --checkpoint-dir, required when the launch has one (a node's
  disk is gone with `sky down`, and a site submitted again resumes from that folder); one of the two that SkyPilot
  0.14's task schema offers:
  - `checkpoint_bucket=URL` (s3://, gs://, r2://, an Azure container's https:// URL, ...): `file_mounts` with the
    bucket in MOUNT_CACHED mode. Not MOUNT: a checkpoint is published by renaming its `.tmp-step-N` folder, and
    MOUNT's S3 driver (goofys) refuses to rename a folder that holds files; MOUNT_CACHED (rclone's VFS cache) renames
    it, and uploads in the background.
  - `checkpoint_volume=NAME`: the task's `volumes:`, a SkyPilot volume made beforehand with `sky volumes apply` (a
    Kubernetes PersistentVolumeClaim, ReadWriteMany for a site of several nodes, or a RunPod network volume).
"""

from __future__ import annotations

from typing import Any


from hetauto.core.errors import HetautoError
from hetauto.launch.node_secret import SECRET_FILE, SECRET_FILE_ENV
from hetauto.launch.plan import LaunchPlan, NodeLaunch, SiteLaunch
from hetauto.launch.targets import dump_yaml, embedded_launch, hookimpl, node_command, one_line, site_header

__all__ = ["SkyPilotTarget", "SKYPILOT_ACCELERATORS", "OPTIONS", "task", "task_path", "accelerators",
           "setup_script", "secret_path", "checkpoint_mount"]

OPTIONS = ("cloud", "region", "zone", "accelerators", "image_id", "torch", "checkpoint_bucket", "checkpoint_volume")
CHECKPOINT_OPTIONS = ("checkpoint_bucket", "checkpoint_volume")
EXTRAS = ("cuda", "rocm", "npu", "xpu")  # backends with an extra of their own (pip install hetauto[EXTRA])
HOST_BACKENDS = ("cpu", "mock")  # no accelerator to ask for
NODE_RANK = '"$HETAUTO_NODE_RANK"'  # the node agent's --node-rank, as shell text

# hetauto device profile key (hetauto devices) -> SkyPilot accelerator name. Every name is in SkyPilot's catalog
# (skypilot-org/skypilot-catalog catalogs/v7/common/accelerators.csv, and memory in catalogs/v7/common/metadata.csv:
# A100 is the 40 GB part, V100 the 16 GB one). Catalog devices SkyPilot's clouds do not offer under any name (h20,
# h800, mi250x, mi325x, ascend-910b, max-1550) are absent: name them with --site-option SITE.accelerators=NAME.
SKYPILOT_ACCELERATORS = {
    "a10": "A10",
    "a100-40g": "A100",
    "a100-80g": "A100-80GB",
    "b200": "B200",
    "gh200": "GH200",
    "h100": "H100",
    "h200": "H200",
    "l40s": "L40S",
    "mi300x": "MI300X",
    "rtx-3090": "RTX3090",
    "rtx-4090": "RTX4090",
    "v100-16g": "V100",
    "v100-32g": "V100-32GB",
    "t4": "T4",
    "l4": "L4",
    "a40": "A40",
}


def task_path(site: SiteLaunch) -> str:
    return f"{site.name}/task.yaml"


def _options(site: SiteLaunch) -> dict[str, str]:
    unknown = sorted(set(site.options) - set(OPTIONS))
    if unknown:
        raise HetautoError(f"site '{site.name}': unknown skypilot option '{unknown[0]}' (known: {', '.join(OPTIONS)}; "
                           f"pass them as --site-option {site.name}.KEY=VALUE)")
    opts = {k: v.strip() for k, v in site.options.items()}
    for key, value in opts.items():
        if not value:
            raise HetautoError(f"site '{site.name}': option {key} is empty (--site-option {site.name}.{key}=VALUE)")
    return opts


def _equal_nodes(site: SiteLaunch) -> NodeLaunch:
    """The site's first node; refuses a site that one SkyPilot task cannot hold."""
    nodes = sorted(site.nodes, key=lambda n: n.node_rank)
    first = nodes[0]
    shapes = {(n.nproc, n.backend, n.device_type) for n in nodes}
    if len(shapes) > 1:
        kinds = "; ".join(f"cluster {n.cluster} node {n.node} (node rank {n.node_rank}): {n.nproc} x {n.device_type}"
                          for n in nodes)
        uneven = [c for c in site.clusters if len({(n.nproc, n.device_type) for n in site.cluster_nodes(c)}) > 1]
        if uneven:  # no --site can split one cluster's nodes
            why = (f"the plan uses a different number of devices on the nodes of cluster {uneven[0]}: use a plan "
                   "that fills its nodes evenly, or the torchrun, slurm or kubernetes target, which run unequal nodes")
        else:
            why = ("split it with one --site per kind of node, e.g. "
                   + " ".join(f"--site {site.name}-{c}={c}" for c in site.clusters))
        raise HetautoError(f"site '{site.name}': a SkyPilot task runs equal nodes (one process count, one device), "
                           f"but its nodes differ ({kinds}); {why}")
    ranks = [n.node_rank for n in nodes]
    if ranks != list(range(first.node_rank, first.node_rank + len(nodes))):
        raise HetautoError(f"site '{site.name}': node ranks {ranks} are not consecutive, so $SKYPILOT_NODE_RANK cannot "
                           "number them; make the clusters whose nodes interleave separate sites (--site)")
    return first


def accelerators(site: SiteLaunch, node: NodeLaunch, opts: dict[str, str]) -> str | None:
    """`NAME:COUNT` for the node's devices; None for a host-only backend (cpu, mock) without the option."""
    given = opts.get("accelerators")
    if given is not None:
        name, sep, count = given.partition(":")
        if not name.strip():
            raise HetautoError(f"site '{site.name}': accelerators {given!r}: expected NAME[:COUNT], e.g. H100:8")
        if sep:
            try:
                ok = float(count) == node.nproc
            except ValueError:
                ok = False
            if not ok:
                raise HetautoError(f"site '{site.name}': accelerators {given!r}: each node runs {node.nproc} "
                                   f"process(es), one per device; write {name.strip()}:{node.nproc}")
        return f"{name.strip()}:{node.nproc}"
    if node.backend in HOST_BACKENDS:
        return None
    name = SKYPILOT_ACCELERATORS.get(node.device_type)
    if name is None:
        raise HetautoError(f"site '{site.name}': no SkyPilot accelerator name is known for device '{node.device_type}'"
                           f"; pass --site-option {site.name}.accelerators=NAME:{node.nproc} (sky show-gpus lists "
                           "the names)")
    return f"{name}:{node.nproc}"


def secret_path(launch: LaunchPlan) -> str:
    """Where each node finds the job secret (file_mounts copies the site's control.secret there)."""
    return f"~/.hetauto/job-{launch.plan_sha256[:12]}/{SECRET_FILE}"


def _torch_pin(site: SiteLaunch, opts: dict[str, str]) -> str | None:
    """`torch==VERSION` for setup: the site's `torch` option, else the torch where hetauto launch runs; None:
    the image's own torch (`torch=image`, or no torch here)."""
    given = opts.get("torch")
    if given == "image":
        return None
    if given is None:
        from importlib import metadata

        try:  # its public version: a local label (+cpu, +cu126) names a build of one index, not of every site's
            given = metadata.version("torch").split("+", 1)[0]
        except metadata.PackageNotFoundError:
            return None
    if not all(part.isalnum() for part in given.replace("+", ".").split(".")):
        raise HetautoError(f"site '{site.name}': option torch {given!r} is not a version (e.g. 2.13.0, or 'image' "
                           "to keep the image's torch)")
    return f"torch=={given}"


def setup_script(site: SiteLaunch, first: NodeLaunch, opts: dict[str, str]) -> str:
    """The task's `setup:`: this hetauto with the backend's extra, and the pinned torch."""
    from hetauto import __version__

    extra = f"[{first.backend}]" if first.backend in EXTRAS else ""
    torch = _torch_pin(site, opts)
    return ("set -euo pipefail\n"
            f'"${{HETAUTO_PYTHON:-python3}}" -m pip install "hetauto{extra}=={__version__}"'
            + (f' "{torch}"' if torch else "") + "\n")


def checkpoint_mount(launch: LaunchPlan, site: SiteLaunch, opts: dict[str, str]) -> dict[str, Any]:
    """The task's fields that mount the checkpoint volume at the launch's --checkpoint-dir ({} without checkpoints):
    `file_mounts` for a bucket, `volumes` for a SkyPilot volume."""
    given = [key for key in CHECKPOINT_OPTIONS if key in opts]
    folder = launch.run_config().checkpoint.dir
    if not folder:
        if given:
            raise HetautoError(f"site '{site.name}': option {given[0]} is given but the launch writes no checkpoints; "
                               "pass --checkpoint-dir /ABSOLUTE/PATH (where the nodes mount it)")
        return {}
    if not given:
        raise HetautoError(f"site '{site.name}': the launch writes checkpoints to {folder}, and a node's disk is gone "
                           f"with `sky down`: pass --site-option {site.name}.checkpoint_bucket=URL (a bucket, e.g. "
                           f"s3://BUCKET/PATH) or --site-option {site.name}.checkpoint_volume=NAME (a SkyPilot volume: "
                           "sky volumes apply) to mount there")
    if len(given) > 1:
        raise HetautoError(f"site '{site.name}': options checkpoint_bucket and checkpoint_volume both mount the "
                           "checkpoint folder; give one")
    if not folder.startswith("/"):
        raise HetautoError(f"--checkpoint-dir {folder}: the skypilot target mounts the checkpoint volume there, so "
                           "give an absolute path (e.g. /checkpoints)")
    if given[0] == "checkpoint_volume":
        return {"volumes": {folder: opts["checkpoint_volume"]}}
    url = opts["checkpoint_bucket"]
    if "://" not in url:
        raise HetautoError(f"site '{site.name}': checkpoint_bucket {url!r} is not a bucket URL (e.g. s3://BUCKET/PATH, "
                           "gs://BUCKET/PATH)")
    return {"file_mounts": {folder: {"source": url, "mode": "MOUNT_CACHED"}}}


def _script(launch: LaunchPlan, site: SiteLaunch, first: NodeLaunch) -> str:
    count = len(site.nodes)
    ranks = f"node rank {first.node_rank}" if count == 1 else \
        f"node ranks {first.node_rank}-{first.node_rank + count - 1} (SkyPilot node i: node rank {first.node_rank} + i)"
    return (
        f"# hetauto launch (skypilot): site '{one_line(site.name)}', {ranks} of {launch.num_nodes}; "
        f"{first.nproc} process(es) per node, backend {one_line(first.backend)}\n"
        "set -euo pipefail\n"
        "export HETAUTO_NODE_RANK=$((HETAUTO_FIRST_NODE_RANK + ${SKYPILOT_NODE_RANK:?not run by SkyPilot}))\n"
        f'work="${{HETAUTO_WORKDIR:-$HOME/hetauto-job-{launch.plan_sha256[:12]}}}"\n'
        'mkdir -p "$work"\n'
        'cd "$work"\n'
        f'export {SECRET_FILE_ENV}="${{{SECRET_FILE_ENV}:-$HOME/{secret_path(launch).removeprefix("~/")}}}"\n'
        f'chmod 600 "${SECRET_FILE_ENV}" 2>/dev/null || true  # (a missing one: the agent says so)\n'
        + embedded_launch(launch)
        + f"exec {node_command(NODE_RANK, devices='scheduler')}\n"
    )


def task(launch: LaunchPlan, site: SiteLaunch) -> dict[str, Any]:
    """The SkyPilot task of one site, as the dict that is written as YAML."""
    opts = _options(site)
    first = _equal_nodes(site)
    resources: dict[str, Any] = {}
    for key in ("cloud", "region", "zone"):
        if key in opts:
            resources[key] = opts[key]
    acc = accelerators(site, first, opts)
    if acc is None:
        resources["cpus"] = f"{first.nproc}+"
    else:
        resources["accelerators"] = acc
    if "image_id" in opts:
        resources["image_id"] = opts["image_id"]
    checkpoints = checkpoint_mount(launch, site, opts)
    rdzv = launch.rendezvous
    if site.name == rdzv.lead_site and len(launch.sites) > 1:  # the other sites reach the lead's two ports
        resources["ports"] = [rdzv.master_port, rdzv.control_port]
    return {
        "name": f"hetauto-{site.name}-{launch.plan_sha256[:8]}",
        "num_nodes": len(site.nodes),
        "resources": resources,
        "envs": {"HETAUTO_FIRST_NODE_RANK": str(first.node_rank), "MASTER_ADDR": rdzv.master_addr,
                 "MASTER_PORT": str(rdzv.master_port), "PYTHONUNBUFFERED": "1"},
        "file_mounts": {secret_path(launch): SECRET_FILE, **checkpoints.get("file_mounts", {})},
        **({"volumes": checkpoints["volumes"]} if "volumes" in checkpoints else {}),
        "setup": setup_script(site, first, opts),
        "run": _script(launch, site, first),
    }


def _header(launch: LaunchPlan, site: SiteLaunch) -> str:
    rdzv = launch.rendezvous
    lead = site.name == rdzv.lead_site
    role = (f"the lead site: its head node (node rank 0) serves the rendezvous ({rdzv.master_port}) and the control "
            f"store ({rdzv.control_port});\n# {rdzv.master_addr} must be that node's address (e.g. a reserved static "
            "IP), reachable from every site on both ports" if lead else
            f"its nodes join the lead at {rdzv.master_addr} ports {rdzv.master_port} and {rdzv.control_port}")
    return site_header("skypilot", launch, site, role,
                       "# The nodes talk to the other sites' nodes directly (the collectives); open the job's ports "
                       "to those\n# nodes only (the rendezvous accepts any connection; the control store wants the job's "
                       "control.secret).\n"
                       f"# Submit with, in this folder (file_mounts copies its {SECRET_FILE} to each node): sky launch "
                       f"-c hetauto-{one_line(site.name)} task.yaml\n")


class SkyPilotTarget:
    name = "skypilot"
    summary = "one SkyPilot task per site (equal nodes); sky launch SITE/task.yaml"

    def render(self, launch: LaunchPlan) -> dict[str, str]:
        return {task_path(s): _header(launch, s) + dump_yaml(task(launch, s)) for s in launch.sites}


@hookimpl
def hetauto_launch_targets(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(SkyPilotTarget())
