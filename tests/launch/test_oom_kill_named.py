"""A rank the kernel's OOM killer ends is named so, from the kernel's own record (issue 44 item 4): a real 2-rank
`hetauto run` in a memory cgroup of its own (a limit of 1.5 GiB; the v1 or v2 controller of this process's cgroup,
where this process may create one), rank 1 allocating until the kernel kills it (`--inject-fault action=oom`). Where
no memory cgroup can be made here (not root, a read-only cgroup tree), the same fault is a plain SIGKILL and the
line must say what it cannot tell apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetauto.core.plan import Plan, StagePlan
from hetauto.launch.diagnosis import kernel_oom_record
from hetauto.testing.memory_cgroup import enter_cgroup, memory_cgroup, remove_cgroup
from hetauto.testing.two_sites import this_tree_env

CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: b, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""
LIMIT = 1536 << 20


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_rank_killed_by_the_oom_killer_is_named_from_the_kernels_record(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text(CLUSTER)
    stage = lambda c, layers: StagePlan(cluster=c, device_type="cpu", devices=(0,), layers=layers, tp=1, dp=1)
    Plan(model="tiny-gpt", cluster="two.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=(stage("a", (0, 3)), stage("b", (3, 6)))).save(tmp_path / "plan.json")
    cgroup = memory_cgroup(LIMIT)
    action = "oom" if cgroup is not None else "sigkill"

    def enter() -> None:
        if cgroup is not None:
            enter_cgroup(cgroup)

    try:
        done = subprocess.run([sys.executable, "-m", "hetauto.cli", "run", str(tmp_path / "plan.json"), "--steps",
                               "3", "--json", "--no-reference", "--timeout", "10", "--inject-fault",
                               f"rank=1,step=1,action={action}"], cwd=tmp_path, capture_output=True, text=True,
                              env=this_tree_env(), preexec_fn=enter, timeout=280)
    finally:
        if cgroup is not None:
            remove_cgroup(cgroup)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = json.loads(done.stdout)["error"]
    if cgroup is None:
        assert line.startswith("rank 1 (stage 1, cluster 'b') was killed by SIGKILL (the kernel's OOM killer or an "
                               "operator's kill -9)"), line
        return
    assert line.startswith("rank 1 (stage 1, cluster 'b') was killed by SIGKILL from the kernel's OOM killer ("), line
    assert ("(its log: 'Memory cgroup out of memory: Killed process " in line  # the kernel log, where readable
            or f"(out of memory: {cgroup}/memory." in line and "counts 1 oom_kill(s))" in line), line
    assert "; give the ranks more memory or plan with more --headroom" in line, line


def test_the_kernel_logs_oom_line_is_read_for_the_ranks_pid_only(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("6,1,0,-;something else\n"
                   "3,2,5,-;Memory cgroup out of memory: Killed process 4242 (python3) total-vm:1kB, anon-rss:1kB\n"
                   "3,3,6,-;Out of memory: Killed process 77 (python3) total-vm:1kB\n")
    assert kernel_oom_record(4242, str(log)) == "Memory cgroup out of memory: Killed process 4242 (python3)"
    assert kernel_oom_record(77, str(log)) == "Out of memory: Killed process 77 (python3)"
    assert kernel_oom_record(424, str(log)) is None and kernel_oom_record(1, str(tmp_path / "absent")) is None
