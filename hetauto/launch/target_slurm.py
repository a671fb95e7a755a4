"""The `slurm` launch target: one `sbatch` script per site, `<site>/job.sbatch`; submit it at that site with
`sbatch <site>/job.sbatch` from the folder the nodes' working folders go into.

A site's job has one node per launch-plan node and runs one node agent per node (`srun`, one task per node): a
bash array indexed by `$SLURM_NODEID` gives each agent its node rank (the nodes of one cluster may run different
process counts; each agent reads its own from launch.json), and each node works in its own folder
`${HETAUTO_WORKDIR:-$PWD/hetauto-job-<sha12>}-node<NODE_RANK>` (two nodes never share one). The devices are the
scheduler's: `--gpus-per-node` for a backend other than cpu/mock, and the agent takes the visible devices Slurm's
gres sets (`--visible-devices scheduler`). A site that runs several of the plan's clusters is one heterogeneous
job: one component per cluster (`#SBATCH hetjob` between them), one `srun --het-group=K` per component, run
together; the job fails when any of them does.

Site options (`--site-option SITE.KEY=VALUE`): `partition`, `account`, `time`, `qos`, `constraint`, `mem`,
`cpus-per-task` (a positive integer; given to each srun too, which does not take it from the job in Slurm
22.05-23.02) and `exclusive` (`yes`, or Slurm's `user`, `mcs`, `topo`), each for every component of the site's
job; `KEY@CLUSTER` (e.g. `--site-option siteA.partition@h100=gpu`) sets it for that cluster's component only (a
heterogeneous job's components usually sit in different partitions).

Checked against Slurm's documentation and source (SchedMD/slurm, master of 2026-08 and tag slurm-22-05-8-1,
Debian 12's slurm-wlm 22.05.8), and on a local two-node Slurm 22.05.8 (scripts/slurm-local.sh):
- doc/html/heterogeneous_jobs.shtml: components of a batch script are separated by a line "#SBATCH hetjob"; the
  script runs on the first node of component 0; options such as --output belong in the first component only
  (--job-name, --account, --qos, --time propagate to later components, --partition does not); srun runs on
  component 0 unless given --het-group=K; each srun --het-group=K is its own step, and the docs' example runs
  them in the background and `wait`s; hetjobs are scheduled only by sched/backfill.
- SLURM_NODEID (srun(1): "the relative node ID of the current node") is the step's node index plus the step's
  het-job node offset (src/slurmd/slurmstepd/task.c, exec_task); srun sets that offset over the components of
  its own step only (src/srun/srun_job.c), so in `srun --het-group=K` it counts from 0 within component K.
  Measured: `srun --het-group=1` in a fast+slow hetjob printed SLURM_NODEID=0 on the slow node.
"""

from __future__ import annotations

import re
import shlex
import textwrap

from hetauto.core.errors import HetautoError
from hetauto.launch.plan import LaunchPlan, NodeLaunch, SiteLaunch
from hetauto.launch.node_secret import SECRET_FILE, SECRET_FILE_ENV
from hetauto.launch.targets import embedded_launch, hookimpl, node_command, one_line

__all__ = ["SlurmTarget", "site_script", "script_path", "OPTIONS", "MAX_NODE_SCRIPT"]

# site options, each an sbatch option of the same name
OPTIONS = ("partition", "account", "time", "qos", "constraint", "mem", "cpus-per-task", "exclusive")
EXCLUSIVE = ("yes", "user", "mcs", "topo")  # yes: a bare --exclusive
HOST_BACKENDS = ("cpu", "mock")  # backends that need no devices from the scheduler
# A node's script travels to srun as one argument (`bash -c SCRIPT`), launch.json included; Linux caps one
# argument at 128 KiB (MAX_ARG_STRLEN).
MAX_NODE_SCRIPT = 120 * 1024
NODE_RANK = '"$NODE_RANK"'  # the node script's variable, as node_command's node rank


# sbatch --time's formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED/INFINITE
_SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
# sbatch --mem's format: a whole number with an optional unit suffix K, M (default), G or T
_SLURM_MEM = re.compile(r"\d+[KMGT]?", re.IGNORECASE)


def script_path(site: SiteLaunch) -> str:
    return f"{site.name}/job.sbatch"


def workdir_default(launch: LaunchPlan) -> str:
    return f"hetauto-job-{launch.plan_sha256[:12]}"


def _component_options(site: SiteLaunch) -> dict[str, dict[str, str]]:
    """cluster -> {sbatch option: value} from the site's options (`KEY` for all, `KEY@CLUSTER` for one)."""
    common: dict[str, str] = {}
    per: dict[str, dict[str, str]] = {c: {} for c in site.clusters}
    known = ", ".join(OPTIONS)
    for key, value in site.options.items():
        name, _, cluster = key.partition("@")
        if name not in OPTIONS:
            raise HetautoError(f"slurm target: site '{site.name}': unknown site option '{key}'; known: {known} "
                               f"(KEY@CLUSTER: for one cluster's component)")
        if cluster and cluster not in site.clusters:
            raise HetautoError(f"slurm target: site '{site.name}': site option '{key}' names '{cluster}', which is "
                               f"not a cluster of the site ({', '.join(site.clusters)})")
        if not value.strip() or any(c.isspace() for c in value):
            raise HetautoError(f"slurm target: site '{site.name}': site option '{key}' must be one word without "
                               f"spaces, got {value!r}")
        if name == "cpus-per-task" and not (value.isdigit() and int(value) > 0):
            raise HetautoError(f"slurm target: site '{site.name}': site option '{key}' must be a positive integer, "
                               f"got {value!r}")
        if name == "time" and not _SLURM_TIME.fullmatch(value):
            raise HetautoError(f"slurm target: site '{site.name}': site option '{key}' must be a Slurm time limit "
                               f"(MINUTES, H:MM:SS, D-HH[:MM[:SS]] or UNLIMITED), got {value!r}; sbatch would refuse it")
        if name == "mem" and not _SLURM_MEM.fullmatch(value):
            raise HetautoError(f"slurm target: site '{site.name}': site option '{key}' must be a Slurm memory size "
                               f"(a whole number with K, M, G or T, e.g. 64G), got {value!r}; sbatch would refuse it")
        if name == "exclusive" and value not in EXCLUSIVE:
            raise HetautoError(f"slurm target: site '{site.name}': site option '{key}' must be one of "
                               f"{', '.join(EXCLUSIVE)}, got {value!r}")
        (per[cluster] if cluster else common)[name] = value
    return {c: {**common, **per[c]} for c in site.clusters}


def _sbatch_option(name: str, value: str) -> str:
    return "--exclusive" if (name, value) == ("exclusive", "yes") else f"--{name}={value}"


def _gpus(nodes: tuple[NodeLaunch, ...]) -> str:
    """The option that asks Slurm for a component's devices ('' for cpu and mock: none needed)."""
    return "" if nodes[0].backend in HOST_BACKENDS else f"--gpus-per-node={max(n.nproc for n in nodes)}"


def _node_script(launch: LaunchPlan, components: list[tuple[str, tuple[NodeLaunch, ...]]]) -> str:
    """What srun runs on each node: pick the node rank (by the component, the script's first argument, in a
    heterogeneous job), make the node's folder, write launch.json there, start the agent (the batch script's
    arguments follow the agent's own)."""
    def ranks(nodes: tuple[NodeLaunch, ...]) -> str:
        return "(" + " ".join(str(n.node_rank) for n in nodes) + ")"

    if len(components) == 1:
        cluster, nodes = components[0]
        pick = f"node_ranks={ranks(nodes)}  # cluster '{cluster}': the node rank of each node, by $SLURM_NODEID\n"
    else:
        pick = ('case "${1:-}" in  # the component this step runs: its node ranks, by $SLURM_NODEID\n'
                + "".join(f"    {k}) node_ranks={ranks(nodes)} ;;  # cluster '{cluster}'\n"
                          for k, (cluster, nodes) in enumerate(components))
                + '    *) echo "hetauto: no component \'${1:-}\' in this job" >&2; exit 2 ;;\n'
                  "esac\n"
                  "shift\n")
    text = (
        "set -euo pipefail\n"
        + pick
        + 'NODE_RANK="${node_ranks[${SLURM_NODEID:?not started by srun}]:-}"\n'
        'if [[ -z $NODE_RANK ]]; then\n'
        '    echo "hetauto: SLURM_NODEID=$SLURM_NODEID but the step has ${#node_ranks[@]} node(s)" >&2\n'
        "    exit 2\n"
        "fi\n"
        f'export {SECRET_FILE_ENV}="${{{SECRET_FILE_ENV}:-$PWD/{SECRET_FILE}}}"'
        "  # the job secret: a path, never its text\n"
        f'work="${{HETAUTO_WORKDIR:-$PWD/{workdir_default(launch)}}}-node$NODE_RANK"\n'
        'mkdir -p "$work"\n'
        'cd "$work"\n'
        + embedded_launch(launch)
        + f'exec {node_command(NODE_RANK, devices="scheduler")} "$@"\n'
    )
    if len(text.encode()) > MAX_NODE_SCRIPT:
        raise HetautoError(f"slurm target: the node script is {len(text.encode())} bytes, over the "
                           f"{MAX_NODE_SCRIPT} bytes one srun argument may carry (the launch plan is too large: "
                           "embed fewer or smaller files)")
    return text


def site_script(launch: LaunchPlan, site: SiteLaunch) -> str:
    """The site's sbatch script (a heterogeneous job when the site runs several clusters)."""
    rdzv = launch.rendezvous
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", site.name):
        raise HetautoError(f"slurm target: site name {site.name!r} names the job (hetauto-<site>) and its folder: "
                           "use letters, digits, '_', '.' and '-' only")
    options = _component_options(site)
    components = [(c, site.cluster_nodes(c)) for c in site.clusters if site.cluster_nodes(c)]
    het = len(components) > 1
    lead = any(n.node_rank == 0 for n in site.nodes)
    role = (f"This is the lead site: node rank 0 serves the rendezvous on port {rdzv.master_port} and the control "
            f"store on port {rdzv.control_port} at {rdzv.master_addr} and writes the run's result (result.json in "
            "its working folder)" if lead else
            f"Its nodes join the lead at {rdzv.master_addr} ports {rdzv.master_port} and {rdzv.control_port}")
    lines = [
        "#!/usr/bin/env bash",
        f"# hetauto launch (slurm): site '{site.name}', {len(site.nodes)} of the job's {launch.num_nodes} node(s), "
        f"{'a heterogeneous job: one component per cluster' if het else 'one cluster'}",
    ]
    for k, (cluster, nodes) in enumerate(components):
        where = f"component {k}: " if het else ""
        desc = ", ".join(f"node rank {n.node_rank} ({n.nproc} process(es), ranks {n.first_rank}-"
                         f"{n.first_rank + n.nproc - 1})" for n in nodes)
        lines.append(f"#   {where}cluster '{cluster}', backend {one_line(nodes[0].backend)}: {desc}")
    lines += ["# " + line for line in textwrap.wrap(role + ".", 112)]
    lines += [
        "# Submit with `sbatch job.sbatch` from the folder the nodes' working folders go into (HETAUTO_WORKDIR picks",
        "# another; each node appends -node<NODE_RANK>); HETAUTO_PYTHON picks the python. That folder holds the",
        f"# job secret, {SECRET_FILE} (HETAUTO_SECRET_FILE names another file).",
    ]
    for k, (cluster, nodes) in enumerate(components):
        if k:
            lines.append("#SBATCH hetjob")  # --output and --job-name only in the first component
        if k == 0:
            lines += [f"#SBATCH --job-name=hetauto-{site.name}", f"#SBATCH --output=hetauto-{site.name}-%j.out"]
        lines += [f"#SBATCH --nodes={len(nodes)}", "#SBATCH --ntasks-per-node=1"]
        lines += [f"#SBATCH {_sbatch_option(name, options[cluster][name])}" for name in OPTIONS
                  if name in options[cluster]]
        lines += [f"#SBATCH {gpus}" for gpus in [_gpus(nodes)] if gpus]
    lines += ["set -euo pipefail", ""]
    lines += ["# what each node runs (srun hands it to bash; launch.json travels inside it)",
              "IFS= read -r -d '' node_script <<'HETAUTO_NODE_SCRIPT' || true",
              _node_script(launch, components) + "HETAUTO_NODE_SCRIPT"]
    srun = []
    for k, (cluster, nodes) in enumerate(components):
        args = ([f"--het-group={k}"] if het else []) + [f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
                                                         "--ntasks-per-node=1", _gpus(nodes), "--kill-on-bad-exit=1"]
        if "cpus-per-task" in options[cluster]:
            args.append(f"--cpus-per-task={options[cluster]['cpus-per-task']}")
        srun.append(f"srun {' '.join(a for a in args if a)} \\\n"
                    f'    bash -c "$node_script" hetauto-node{f" {k}" if het else ""} "$@"')
    if not het:
        lines += ["", srun[0]]
        return "\n".join(lines) + "\n"
    lines += ["", "# one step per component, all at once; the job fails when any of them fails", "pids=()"]
    lines += [f"{cmd} &\npids+=($!)" for cmd in srun]
    names = " ".join(shlex.quote(c) for c, _ in components)
    lines += [
        f"clusters=({names})",
        "status=0",
        'for k in "${!pids[@]}"; do',
        '    if wait "${pids[$k]}"; then continue; else rc=$?; fi',
        '    echo "hetauto: component $k (cluster ${clusters[$k]}) failed with exit code $rc" >&2',
        "    status=1",
        "done",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


class SlurmTarget:
    name = "slurm"
    summary = ("one sbatch script per site, <site>/job.sbatch (a heterogeneous job when a site runs several "
               "clusters); options " + ", ".join(OPTIONS) + " (KEY@CLUSTER: one cluster's component)")

    def render(self, launch: LaunchPlan) -> dict[str, str]:
        return {script_path(s): site_script(launch, s) for s in launch.sites}


@hookimpl
def hetauto_launch_targets(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(SlurmTarget())
