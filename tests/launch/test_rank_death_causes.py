"""Every rank death names its cause (issue 44 item 4): real faults in a real 2-rank `hetauto run` (torchrun, gloo):
a rank that SIGKILLs itself, one that reads a memory-mapped file truncated under it (SIGBUS), one that runs out of
file descriptors (EMFILE); and the kernel's OOM record read from cgroup files (v1 and v2 layouts)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import pytest

from hetauto.cli import main
from hetauto.core.plan import Plan, StagePlan
from hetauto.launch.diagnosis import death_by_signal, oom_kills, shrunk_data_file
from hetauto.runtime.token_data import write_tokens
from hetauto.testing.two_sites import this_tree_env

CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: b, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""
SIGKILL_CAUSE = "was killed by SIGKILL"  # then the OOM record, or "(the kernel's OOM killer or an operator's kill -9)"


def _stage(cluster: str, layers: tuple[int, int]) -> StagePlan:
    return StagePlan(cluster=cluster, device_type="cpu", devices=(0,), layers=layers, tp=1, dp=1)


def _fault(tmp_path: Path, action: str) -> str:
    """The error line of a 2-rank run whose rank 1 meets `action` at step 1."""
    (tmp_path / "two.yaml").write_text(CLUSTER)
    Plan(model="tiny-gpt", cluster="two.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=(_stage("a", (0, 3)), _stage("b", (3, 6)))).save(tmp_path / "plan.json")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", str(tmp_path / "plan.json"), "--steps", "3", "--json", "--no-reference", "--timeout", "10",
                     "--inject-fault", f"rank=1,step=1,action={action}"])
    assert code != 0 and "Traceback" not in err.getvalue(), err.getvalue()[-3000:]
    line = json.loads(out.getvalue())["error"]
    assert "\n" not in line and "died without an error" not in line and "never started" not in line, line
    return line


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_rank_killed_by_sigkill_is_named_with_the_signal_and_its_meaning(tmp_path: Path) -> None:
    line = _fault(tmp_path, "sigkill")
    assert line.startswith(f"rank 1 (stage 1, cluster 'b') {SIGKILL_CAUSE}"), line
    if oom_kills() is None:
        assert line.startswith("rank 1 (stage 1, cluster 'b') was killed by SIGKILL (the kernel's OOM killer or an "
                               "operator's kill -9)"), line


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_rank_reading_a_truncated_mapping_dies_of_sigbus_named_so(tmp_path: Path) -> None:
    line = _fault(tmp_path, "sigbus")
    assert line.startswith("rank 1 (stage 1, cluster 'b') died of SIGBUS (bus error: a memory-mapped file (--data?) "
                           "shrank under the rank)"), line


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_rank_out_of_file_descriptors_names_the_limit_to_raise(tmp_path: Path) -> None:
    # with the test zygote too: its stand-in for getppid reads /proc, which fails with EMFILE in this rank, and it
    # must not then take the parent for gone (LauncherGone instead of the EMFILE)
    line = _fault(tmp_path, "emfile")
    assert line.startswith("rank 1 (stage 1, cluster 'b') failed: too many open files: raise ulimit -n (now "), line


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_data_file_truncated_mid_run_is_named_as_the_cause_of_the_sigbus(tmp_path: Path) -> None:
    """The probe's fault itself: `--data tokens.bin` cut to one page while the rank trains on it (after its first
    step, of 100000: the run is far from its end). The rank's next read past the new end dies of SIGBUS, and the
    line names the data file, its size now and what its sidecar says (it said '(--data?)', a guess)."""
    (tmp_path / "one.yaml").write_text(CLUSTER.split("  - {name: b")[0] + "links:\n  default: {bandwidth: 1Gbps, "
                                                                         "latency: 1ms}\n")
    Plan(model="tiny-gpt", cluster="one.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=(_stage("a", (0, 6)),)).save(tmp_path / "plan.json")
    rng = np.random.default_rng(0)
    data = write_tokens(tmp_path / "tokens.bin", [rng.integers(0, 256, 200_000)], vocab_size=256)
    steps = tmp_path / "steps.jsonl"
    run = subprocess.Popen([sys.executable, "-m", "hetauto", "run", str(tmp_path / "plan.json"), "--data", str(data),
                            "--steps", "100000", "--json", "--no-reference", "--timeout", "10", "--log-jsonl",
                            str(steps)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=this_tree_env())
    try:
        end = time.monotonic() + 120
        while not (steps.is_file() and steps.read_text().strip()):  # the rank has mapped the file and trained
            assert run.poll() is None and time.monotonic() < end, run.communicate()[1][-3000:]
            time.sleep(0.05)
        os.truncate(data, 4096)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode != 0 and "Traceback" not in err, err[-3000:]
    line = json.loads(out)["error"]
    assert line.startswith(f"rank 0 (stage 0, cluster 'a') died of SIGBUS (bus error): the data file {data} (now "
                           "4096 bytes; its sidecar says 200000 tokens, 400000 bytes) was truncated while the rank "
                           "read it; restore it and --resume from the newest checkpoint"), line


def test_the_oom_killer_is_named_from_the_kernels_record_v1_and_v2(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (tmp_path / "cg2").write_text("0::/job\n")
    assert oom_kills(str(tmp_path / "cg2"), str(v2)) == (str(v2 / "job" / "memory.events"), 1)
    v1 = tmp_path / "v1"
    (v1 / "memory" / "x").mkdir(parents=True)
    (v1 / "memory" / "x" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (tmp_path / "cg1").write_text("5:cpu:/\n4:memory:/x\n0::/\n")
    assert oom_kills(str(tmp_path / "cg1"), str(v1)) == (str(v1 / "memory" / "x" / "memory.oom_control"), 2)
    (v1 / "memory" / "x" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert oom_kills(str(tmp_path / "cg1"), str(v1)) is None
    assert oom_kills(str(tmp_path / "absent")) is None


def test_signals_other_than_kill_and_bus_are_named_and_plain_exits_are_not() -> None:
    assert death_by_signal(43) is None and death_by_signal(0) is None
    assert death_by_signal(-15) == "was killed by SIGTERM (Terminated, exit code -15)"
    assert death_by_signal(-7) == "died of SIGBUS (bus error: a memory-mapped file (--data?) shrank under the rank)"
    assert death_by_signal(-7, data_shrunk="d.bin (now 0 bytes; ...)") == (
        "died of SIGBUS (bus error): the data file d.bin (now 0 bytes; ...) was truncated while the rank read it; "
        "restore it and --resume from the newest checkpoint")
    assert death_by_signal(-9, data_shrunk="d.bin").startswith("was killed by SIGKILL")  # the file names SIGBUS only


def test_only_a_token_file_shorter_than_its_sidecar_is_named(tmp_path: Path) -> None:
    data = write_tokens(tmp_path / "t.bin", [np.arange(100) % 256], vocab_size=256)
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"data": {"path": str(data)}}))
    assert shrunk_data_file(run) is None  # whole
    os.truncate(data, 64)
    assert shrunk_data_file(run) == f"{data} (now 64 bytes; its sidecar says 100 tokens, 200 bytes)"
    run.write_text(json.dumps({"data": {"path": None}}))
    assert shrunk_data_file(run) is None and shrunk_data_file(tmp_path / "absent.json") is None
    assert death_by_signal(-200) == "was killed by signal 200 (exit code -200)"
