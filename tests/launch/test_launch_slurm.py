"""The `slurm` launch target (hetauto.launch.target_slurm): one sbatch script per site, a heterogeneous job where
a site runs several clusters.

The rendering tests need no Slurm: they read the scripts, check them with `bash -n`, and run them with a stand-in
`srun` (runs its command once per node with SLURM_NODEID set) and a stand-in python (records what the node agent
was given). The end-to-end tests (marker `slurm`) submit the scripts `hetauto launch --target slurm` writes to a
real Slurm, the two-node one scripts/slurm-local.sh starts on this machine (partitions fast and slow): the
`local_slurm` fixture (conftest.py) runs that script when no Slurm answers; where it cannot (not root, no Slurm and
no apt-get) they fail and say so, unless HETAUTO_NO_SLURM=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hetauto.core.errors import HetautoError
from hetauto.launch.plan import LaunchPlan, derive
from hetauto.launch.target_slurm import SlurmTarget
from hetauto.launch.targets import get_targets
from hetauto.testing.multiproc import two_free_ports
from hetauto.testing.two_sites import one_rank_per_end

RUN = {"steps": 2, "seed": 0, "timeout_s": 60.0, "backends": ["cpu", "cpu", "mock"], "emulate": "none"}
BOTH = {"both": ("fast", "slow")}


@pytest.fixture(scope="module")
def cpu_demo() -> tuple[Any, Any]:
    """The cpu-demo scenario's plan (stages fast 0, fast 1, slow 0-1 with dp 2) and its ClusterSpec."""
    import hetauto
    from hetauto.planner.evaluate import inputs_for_plan

    plan = hetauto.plan("cpu-demo").plan
    return plan, inputs_for_plan(plan).cluster


def launch_plan(cpu_demo: tuple[Any, Any], *, sites: dict[str, tuple[str, ...]] | None = None,
                options: dict[str, dict[str, str]] | None = None, backends: tuple[str, ...] = ("cpu", "cpu", "mock"),
                ) -> LaunchPlan:
    plan, cluster = cpu_demo
    return derive(plan, cluster, {**RUN, "backends": list(backends)}, master="10.0.0.1", port=29500,
                  backends=list(backends), visible_env={}, sites=sites,
                  site_env={"slow": {"HETAUTO_MOCK_DEVICES": "2"}}, site_options=options)


def directives(script: str) -> list[list[str]]:
    """The #SBATCH lines of each component (split at `#SBATCH hetjob`), as written."""
    components: list[list[str]] = [[]]
    for line in script.splitlines():
        if line == "#SBATCH hetjob":
            components.append([])
        elif line.startswith("#SBATCH "):
            components[-1].append(line[len("#SBATCH "):])
    return components


def sruns(script: str) -> list[str]:
    """The srun commands of a script, each on one line (continuation lines joined)."""
    joined = re.sub(r" \\\n\s+", " ", script)
    return [line for line in joined.splitlines() if line.startswith("srun ")]


def node_script(script: str) -> str:
    match = re.search(r"<<'HETAUTO_NODE_SCRIPT' \|\| true\n(.*?)\nHETAUTO_NODE_SCRIPT\n", script, re.S)
    assert match, script
    return match.group(1)


# --- rendering

def test_slurm_is_a_registered_target() -> None:
    target = get_targets(entry_points=False).get("slurm")
    assert isinstance(target, SlurmTarget) and "sbatch" in target.summary


def test_one_sbatch_script_per_site(cpu_demo) -> None:
    launch = launch_plan(cpu_demo, options={"fast": {"partition": "fast"}, "slow": {"partition": "slow"}})
    files = SlurmTarget().render(launch)
    assert sorted(files) == ["fast/job.sbatch", "slow/job.sbatch"]
    sha = launch.plan_sha256[:12]
    for site, ranks in (("fast", "(0)"), ("slow", "(1)")):
        text = files[f"{site}/job.sbatch"]
        assert text.startswith("#!/usr/bin/env bash\n")
        assert directives(text) == [[f"--job-name=hetauto-{site}", f"--output=hetauto-{site}-%j.out", "--nodes=1",
                                     "--ntasks-per-node=1", f"--partition={site}"]]
        inner = node_script(text)
        assert f"node_ranks={ranks}  # cluster '{site}'" in inner
        assert 'NODE_RANK="${node_ranks[${SLURM_NODEID:?not started by srun}]:-}"' in inner
        assert f'work="${{HETAUTO_WORKDIR:-$PWD/hetauto-job-{sha}}}-node$NODE_RANK"' in inner
        assert ('exec "${HETAUTO_PYTHON:-python3}" -m hetauto node launch.json --node-rank "$NODE_RANK" '
                '--visible-devices scheduler "$@"') in inner
        assert launch.to_json(indent=None) in inner  # the whole launch plan travels in the script
        assert sruns(text) == ['srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --kill-on-bad-exit=1 '
                               'bash -c "$node_script" hetauto-node "$@"']
        assert "hetjob" not in text and "--gpus-per-node" not in text  # cpu and mock need no devices


GOLDEN_HETJOB = """\
#!/usr/bin/env bash
# hetauto launch (slurm): site 'both', 2 of the job's 2 node(s), a heterogeneous job: one component per cluster
#   component 0: cluster 'fast', backend cpu: node rank 0 (2 process(es), ranks 0-1)
#   component 1: cluster 'slow', backend mock: node rank 1 (2 process(es), ranks 2-3)
# This is the lead site: node rank 0 serves the rendezvous on port 29500 and the control store on port 29501 at
# 10.0.0.1 and writes the run's result (result.json in its working folder).
# Submit with `sbatch job.sbatch` from the folder the nodes' working folders go into (HETAUTO_WORKDIR picks
# another; each node appends -node<NODE_RANK>); HETAUTO_PYTHON picks the python. That folder holds the
# job secret, control.secret (HETAUTO_SECRET_FILE names another file).
#SBATCH --job-name=hetauto-both
#SBATCH --output=hetauto-both-%j.out
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --partition=fast
#SBATCH --account=proj1
#SBATCH hetjob
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --partition=slow
#SBATCH --account=proj1
set -euo pipefail

# what each node runs (srun hands it to bash; launch.json travels inside it)
IFS= read -r -d '' node_script <<'HETAUTO_NODE_SCRIPT' || true
set -euo pipefail
case "${1:-}" in  # the component this step runs: its node ranks, by $SLURM_NODEID
    0) node_ranks=(0) ;;  # cluster 'fast'
    1) node_ranks=(1) ;;  # cluster 'slow'
    *) echo "hetauto: no component '${1:-}' in this job" >&2; exit 2 ;;
esac
shift
NODE_RANK="${node_ranks[${SLURM_NODEID:?not started by srun}]:-}"
if [[ -z $NODE_RANK ]]; then
    echo "hetauto: SLURM_NODEID=$SLURM_NODEID but the step has ${#node_ranks[@]} node(s)" >&2
    exit 2
fi
export HETAUTO_SECRET_FILE="${HETAUTO_SECRET_FILE:-$PWD/control.secret}"  # the job secret: a path, never its text
work="${HETAUTO_WORKDIR:-$PWD/hetauto-job-<sha12>}-node$NODE_RANK"
mkdir -p "$work"
cd "$work"
cat > launch.json <<'HETAUTO_LAUNCH_JSON'
<launch.json>
HETAUTO_LAUNCH_JSON
exec "${HETAUTO_PYTHON:-python3}" -m hetauto node launch.json --node-rank "$NODE_RANK" --visible-devices scheduler "$@"
HETAUTO_NODE_SCRIPT

# one step per component, all at once; the job fails when any of them fails
pids=()
srun --het-group=0 --nodes=1 --ntasks=1 --ntasks-per-node=1 --kill-on-bad-exit=1 \\
    bash -c "$node_script" hetauto-node 0 "$@" &
pids+=($!)
srun --het-group=1 --nodes=1 --ntasks=1 --ntasks-per-node=1 --kill-on-bad-exit=1 \\
    bash -c "$node_script" hetauto-node 1 "$@" &
pids+=($!)
clusters=(fast slow)
status=0
for k in "${!pids[@]}"; do
    if wait "${pids[$k]}"; then continue; else rc=$?; fi
    echo "hetauto: component $k (cluster ${clusters[$k]}) failed with exit code $rc" >&2
    status=1
done
exit "$status"
"""


def test_golden_heterogeneous_job(cpu_demo) -> None:
    """The whole script of a site holding both clusters, the launch plan and its digest left out (they follow the
    planner's plan)."""
    launch = launch_plan(cpu_demo, sites=BOTH, options={"both": {"partition@fast": "fast", "partition@slow": "slow",
                                                                "account": "proj1"}})
    text = SlurmTarget().render(launch)["both/job.sbatch"]
    text = text.replace(launch.to_json(indent=None), "<launch.json>").replace(launch.plan_sha256[:12], "<sha12>")
    assert text == GOLDEN_HETJOB


def test_site_options_become_sbatch_options(cpu_demo) -> None:
    launch = launch_plan(cpu_demo, options={"fast": {"qos": "high", "time": "00:10:00", "account": "proj1",
                                                     "partition": "cpu"}})
    files = SlurmTarget().render(launch)
    assert directives(files["fast/job.sbatch"])[0][4:] == ["--partition=cpu", "--account=proj1",
                                                           "--time=00:10:00", "--qos=high"]
    assert directives(files["slow/job.sbatch"])[0][4:] == []
    launch = launch_plan(cpu_demo, options={"fast": {"exclusive": "yes", "cpus-per-task": "8", "mem": "0",
                                                     "constraint": "ib"}, "slow": {"exclusive": "user"}})
    files = SlurmTarget().render(launch)
    assert directives(files["fast/job.sbatch"])[0][4:] == ["--constraint=ib", "--mem=0", "--cpus-per-task=8",
                                                           "--exclusive"]
    assert "--kill-on-bad-exit=1 --cpus-per-task=8 \\\n" in files["fast/job.sbatch"]
    assert directives(files["slow/job.sbatch"])[0][4:] == ["--exclusive=user"]


def test_unknown_site_option_is_refused(cpu_demo) -> None:
    launch = launch_plan(cpu_demo, options={"fast": {"gres": "gpu:2"}})
    with pytest.raises(HetautoError) as err:
        SlurmTarget().render(launch)
    assert str(err.value) == ("slurm target: site 'fast': unknown site option 'gres'; known: partition, account, "
                              "time, qos, constraint, mem, cpus-per-task, exclusive (KEY@CLUSTER: for one cluster's "
                              "component)")
    for key, value, want in (("cpus-per-task", "0", "must be a positive integer, got '0'"),
                             ("exclusive", "no", "must be one of yes, user, mcs, topo, got 'no'")):
        with pytest.raises(HetautoError, match=f"site option '{key}' {want}"):
            SlurmTarget().render(launch_plan(cpu_demo, options={"fast": {key: value}}))
    launch = launch_plan(cpu_demo, sites=BOTH, options={"both": {"partition@h100": "gpu"}})
    with pytest.raises(HetautoError, match=r"site option 'partition@h100' names 'h100', which is not a cluster of "
                                           r"the site \(fast, slow\)"):
        SlurmTarget().render(launch)


def test_a_site_with_two_clusters_is_one_heterogeneous_job(cpu_demo) -> None:
    launch = launch_plan(cpu_demo, sites=BOTH, options={"both": {"time": "5", "partition@fast": "fast",
                                                                "partition@slow": "slow"}})
    files = SlurmTarget().render(launch)
    assert list(files) == ["both/job.sbatch"]
    text = files["both/job.sbatch"]
    assert text.count("#SBATCH hetjob\n") == 1
    assert directives(text) == [
        ["--job-name=hetauto-both", "--output=hetauto-both-%j.out", "--nodes=1", "--ntasks-per-node=1",
         "--partition=fast", "--time=5"],
        ["--nodes=1", "--ntasks-per-node=1", "--partition=slow", "--time=5"]]
    inner = node_script(text)
    assert "    0) node_ranks=(0) ;;  # cluster 'fast'\n    1) node_ranks=(1) ;;  # cluster 'slow'\n" in inner
    assert sruns(text) == [f'srun --het-group={k} --nodes=1 --ntasks=1 --ntasks-per-node=1 --kill-on-bad-exit=1 '
                     f'bash -c "$node_script" hetauto-node {k} "$@" &' for k in (0, 1)]
    assert 'if wait "${pids[$k]}"; then continue; else rc=$?; fi' in text
    assert text.rstrip().endswith('exit "$status"')


def test_nodes_of_a_component_with_different_process_counts(cpu_demo) -> None:
    """A gpu cluster with two nodes running 1 and 2 processes: the array holds both node ranks in node order,
    --gpus-per-node asks for the larger count (the agent reads its own from launch.json)."""
    base = launch_plan(cpu_demo, backends=("cuda", "cuda", "mock"))
    node = {"cluster": "fast", "backend": "cuda", "device_type": "cpu", "visible_devices_env": []}
    doc = base.model_dump(mode="json", by_alias=True)
    doc["sites"] = [
        {"name": "fast", "clusters": ["fast"], "options": {"partition": "gpu"}, "nodes": [
            {**node, "node_rank": 0, "node": 0, "first_rank": 0, "nproc": 1, "devices": [0]},
            {**node, "node_rank": 1, "node": 1, "first_rank": 1, "nproc": 2, "devices": [0, 1]}]},
        {"name": "slow", "clusters": ["slow"], "nodes": [
            {**node, "cluster": "slow", "backend": "mock", "node_rank": 2, "node": 0, "first_rank": 3, "nproc": 1,
             "devices": [0]}]}]
    launch = LaunchPlan.model_validate(doc)
    files = SlurmTarget().render(launch)
    fast = files["fast/job.sbatch"]
    assert directives(fast) == [["--job-name=hetauto-fast", "--output=hetauto-fast-%j.out", "--nodes=2",
                                 "--ntasks-per-node=1", "--partition=gpu", "--gpus-per-node=2"]]
    assert "node_ranks=(0 1)" in node_script(fast)
    assert sruns(fast) == ['srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --gpus-per-node=2 --kill-on-bad-exit=1 '
                           'bash -c "$node_script" hetauto-node "$@"']
    assert "--gpus-per-node" not in files["slow/job.sbatch"]
    assert "node_ranks=(2)" in node_script(files["slow/job.sbatch"])


def test_bash_accepts_every_script(cpu_demo, tmp_path: Path) -> None:
    scripts = {**SlurmTarget().render(launch_plan(cpu_demo)),
               **SlurmTarget().render(launch_plan(cpu_demo, sites=BOTH, backends=("cuda", "cuda", "rocm")))}
    assert sorted(scripts) == ["both/job.sbatch", "fast/job.sbatch", "slow/job.sbatch"]
    for i, (path, text) in enumerate(sorted(scripts.items())):
        for j, body in enumerate((text, node_script(text))):
            f = tmp_path / f"{i}-{j}.sh"
            f.write_text(body)
            proc = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, f"{path} ({'node script' if j else 'sbatch script'}): {proc.stderr}"


# --- running the scripts with a stand-in srun and python

FAKE_SRUN = """#!/usr/bin/env bash
# stand-in for srun: its command once per node of the step, SLURM_NODEID set, one after the other
nodes=1
while [[ $1 == --* ]]; do
    case $1 in --nodes=*) nodes=${1#--nodes=} ;; esac
    echo "$1" >> "$FAKE_LOG"
    shift
done
rc=0
for ((i = 0; i < nodes; i++)); do SLURM_NODEID=$i "$@" || rc=$?; done
exit $rc
"""

FAKE_PYTHON = """#!/usr/bin/env bash
# stand-in for python3: records what the node agent was given; FAKE_FAIL_RANK fails that node rank
printf '%s\\n' "$*" > agent.args
[[ " $* " == *" --node-rank ${FAKE_FAIL_RANK:-none} "* ]] && exit 7
exit 0
"""


def run_script(tmp_path: Path, text: str, *args: str, fail_rank: int | None = None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    (tmp_path / "job.sbatch").write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "HETAUTO_PYTHON": str(bin_dir / "python"), "FAKE_LOG": str(tmp_path / "srun.log")}
    env.pop("HETAUTO_WORKDIR", None)
    if fail_rank is not None:
        env["FAKE_FAIL_RANK"] = str(fail_rank)
    return subprocess.run(["bash", "job.sbatch", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)


def test_each_node_gets_its_rank_folder_and_launch_plan(cpu_demo, tmp_path: Path) -> None:
    launch = launch_plan(cpu_demo, sites=BOTH)
    proc = run_script(tmp_path, SlurmTarget().render(launch)["both/job.sbatch"], "--json")
    assert proc.returncode == 0, proc.stderr
    sha = launch.plan_sha256[:12]
    for rank in (0, 1):
        work = tmp_path / f"hetauto-job-{sha}-node{rank}"
        assert (work / "agent.args").read_text() == (f"-m hetauto node launch.json --node-rank {rank} "
                                                     "--visible-devices scheduler --json\n")
        assert LaunchPlan.load(work / "launch.json") == launch
    assert (tmp_path / "srun.log").read_text().split().count("--het-group=1") == 1


def test_a_failed_component_fails_the_job(cpu_demo, tmp_path: Path) -> None:
    proc = run_script(tmp_path, SlurmTarget().render(launch_plan(cpu_demo, sites=BOTH))["both/job.sbatch"],
                      fail_rank=1)
    assert proc.returncode == 1
    assert "hetauto: component 1 (cluster slow) failed with exit code 7" in proc.stderr
    assert "component 0" not in proc.stderr


# --- a real Slurm (scripts/slurm-local.sh)

def job_state(job: str) -> str:
    """JobState of a job (a hetjob's: its components', joined), '' once Slurm forgot it."""
    proc = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30)
    return " ".join(sorted(set(re.findall(r"\bJobState=(\S+)", proc.stdout))))


def wait_jobs(jobs: list[str], timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"], capture_output=True, text=True,
                              timeout=30)
        if proc.returncode != 0 or not proc.stdout.strip():
            break
        time.sleep(1)
    else:
        subprocess.run(["scancel", *jobs], capture_output=True, timeout=30)
    return {job: job_state(job) for job in jobs}


@pytest.mark.slurm
@pytest.mark.multiprocess
@pytest.mark.usefixtures("local_slurm")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", ["site-per-cluster", "hetjob"])
def test_slurm_runs_the_cpu_demo_plan(cpu_demo, tmp_path: Path, layout: str) -> None:
    """`hetauto launch --target slurm` for a plan on cpu-demo's clusters, each site's script submitted from its own
    folder: one site per cluster (partitions fast and slow), or one site holding both (a heterogeneous job, a
    component in each partition). The lead's result.json has every rank and the reference loss. One rank per
    cluster: the smallest plan that needs both sites (the scripts for the 4-rank plan are checked above)."""
    plan, _ = cpu_demo
    one_rank_per_end(plan).save(tmp_path / "plan.json")
    port = two_free_ports()
    if layout == "hetjob":
        sites = ["--site", "both=fast,slow", "--site-option", "both.partition@fast=fast",
                 "--site-option", "both.partition@slow=slow"]
    else:
        sites = ["--site-option", "fast.partition=fast", "--site-option", "slow.partition=slow"]
    from hetauto.cli import main  # the scripts are written in this process; sbatch runs them for real

    assert main(["launch", str(tmp_path / "plan.json"), "--target", "slurm", "--master", f"127.0.0.1:{port}", "-o",
                 str(tmp_path / "out"), "--steps", "2", "--timeout", "60", *sites]) == 0
    launch = LaunchPlan.load(tmp_path / "out" / "launch.json")
    env = {**os.environ, "HETAUTO_PYTHON": sys.executable}
    env.pop("HETAUTO_WORKDIR", None)
    jobs: list[str] = []
    folders = {}
    for site in launch.sites:  # each site submits from its own folder
        folder = folders[site.name] = tmp_path / f"site-{site.name}"
        folder.mkdir()
        shutil.copy(tmp_path / "out" / site.name / "job.sbatch", folder / "job.sbatch")
        shutil.copy(tmp_path / "out" / site.name / "control.secret", folder / "control.secret")
        sub = subprocess.run(["sbatch", "--parsable", "job.sbatch"], cwd=folder, env=env, capture_output=True,
                             text=True, timeout=60)
        assert sub.returncode == 0, sub.stderr
        jobs.append(sub.stdout.strip().split(";")[0])
    states = wait_jobs(jobs, timeout_s=240)

    def logs() -> str:
        return "\n".join(f"--- {p.relative_to(tmp_path)}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(tmp_path.glob("site-*/hetauto-*.out")))

    assert all(s == "COMPLETED" for s in states.values()), f"job states {states}\n{logs()}"
    lead = folders[launch.rendezvous.lead_site] / f"hetauto-job-{launch.plan_sha256[:12]}-node0" / "result.json"
    assert lead.is_file(), logs()
    result = json.loads(lead.read_text())
    assert result["max_loss_diff"] <= 1e-5, result
    assert sorted(r["rank"] for r in result["ranks"]) == [0, 1]
    assert len(result["loss"]) == len(result["reference_loss"]) == 2


def test_without_slurm_and_without_root_the_fixture_fails_saying_how(monkeypatch, tmp_path: Path) -> None:
    """The slurm tests never skip for a missing Slurm: where none answers and none can be started (not root), they
    fail with one line naming the script and the opt-out."""
    from conftest import _start_local_slurm

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception) as err:
        _start_local_slurm(tmp_path / "slurm-local.log")
    assert str(err.value) == (
        "no Slurm answers here and this process cannot start one (it needs root and Slurm or apt-get): start the "
        "local two-node Slurm with `bash scripts/slurm-local.sh` (as root), or set HETAUTO_NO_SLURM=1 to skip the "
        "slurm tests")
    assert not (tmp_path / "slurm-local.log").exists()  # the script never ran
