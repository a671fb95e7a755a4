"""The `torchrun` launch target: one shell script per node, for machines without a scheduler (or inside an
allocation the user already holds). Each script carries the launch plan, writes it into its own working folder and
starts the node agent, which runs torchrun with that node's process count and node rank (static rendezvous)."""

from __future__ import annotations

from hetauto.core.errors import HetautoError
from hetauto.launch.node_secret import SECRET_FILE, SECRET_FILE_ENV
from hetauto.launch.plan import LaunchPlan, NodeLaunch, SiteLaunch
from hetauto.launch.targets import embedded_launch, hookimpl, node_command, one_line

__all__ = ["TorchrunTarget", "node_script", "script_path"]


def script_path(site: SiteLaunch, node: NodeLaunch) -> str:
    return f"{site.name}/node{node.node_rank}.sh"


def workdir_default(launch: LaunchPlan) -> str:
    return f"hetauto-job-{launch.plan_sha256[:12]}"


def _secret_line() -> str:
    """The job secret's file: HETAUTO_SECRET_FILE, else control.secret beside the script (a path, never its text)."""
    here = '$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)'
    return f'export {SECRET_FILE_ENV}="${{{SECRET_FILE_ENV}:-{here}/{SECRET_FILE}}}"\n'


def node_script(launch: LaunchPlan, site: SiteLaunch, node: NodeLaunch, *, devices: str = "plan") -> str:
    rdzv = launch.rendezvous
    lead = node.node_rank == 0
    role = (f"the lead node: it serves the rendezvous on port {rdzv.master_port} and the control store on port "
            f"{rdzv.control_port} at {rdzv.master_addr}, and writes the run's result" if lead else
            f"joins the lead at {rdzv.master_addr} ports {rdzv.master_port} and {rdzv.control_port}")
    last = node.first_rank + node.nproc - 1
    return (
        "#!/usr/bin/env bash\n"
        f"# hetauto launch (torchrun): site '{one_line(site.name)}', cluster '{one_line(node.cluster)}' node {node.node}, "
        f"node rank {node.node_rank} of {launch.num_nodes}: {node.nproc} process(es), ranks {node.first_rank}-{last}, "
        f"backend {one_line(node.backend)}\n"
        f"# {one_line(role)}.\n"
        "# Run it on that machine from any folder; HETAUTO_WORKDIR picks its working folder, HETAUTO_PYTHON the python.\n"
        f"# The job secret is read from {SECRET_FILE} beside this script (HETAUTO_SECRET_FILE names another file).\n"
        "set -euo pipefail\n"
        + _secret_line()
        + f'work="${{HETAUTO_WORKDIR:-$PWD/{workdir_default(launch)}-node{node.node_rank}}}"\n'
        'mkdir -p "$work"\n'
        'cd "$work"\n'
        + embedded_launch(launch)
        + f"exec {node_command(str(node.node_rank), devices=devices)} \"$@\"\n"
    )


class TorchrunTarget:
    name = "torchrun"
    summary = "one shell script per node (torchrun, static rendezvous); run each on its machine"

    def render(self, launch: LaunchPlan) -> dict[str, str]:
        for s in launch.sites:
            if s.options:  # a scheduler's option, which no torchrun script would carry: refused, not dropped
                key = next(iter(s.options))
                raise HetautoError(f"--site-option {s.name}.{key}: the torchrun target has no site options (they are "
                                   "for --target slurm, kubernetes or skypilot); drop it, or choose one of those")
        return {script_path(s, n): node_script(launch, s, n) for s in launch.sites for n in s.nodes}


@hookimpl
def hetauto_launch_targets(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(TorchrunTarget())
