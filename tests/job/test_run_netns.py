"""`hetauto run --emulate netns`: one torchrun per cluster namespace, the stage boundary over a tbf-shaped veth.
The kernel's byte counters on the veth see at least the activations and gradients the executor counted;
losses equal the single-process reference. Needs root and iproute2 (hetauto.launch.netns_topology.available())."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetauto.core.plan import Plan, StagePlan
from hetauto.launch import netns_topology as netns

AVAIL = netns.available()


def _stage(cluster: str, layers: tuple[int, int]) -> StagePlan:
    return StagePlan(cluster=cluster, device_type="cpu", devices=(0,), layers=layers, tp=1, dp=1)


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
@pytest.mark.skipif(not AVAIL.ok, reason=f"network namespaces unavailable: {AVAIL.reason}")
def test_run_over_a_shaped_namespace_link_counts_kernel_bytes(tmp_path: Path, capsys) -> None:
    from hetauto.cli import main

    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(_stage("fast", (0, 3)), _stage("slow", (3, 6))))
    plan.save(tmp_path / "plan.json")
    # in this process: the namespaces, their torchruns and ranks are real (a CLI subprocess imported torch again)
    code = main(["run", str(tmp_path / "plan.json"), "--steps", "2", "--emulate", "netns", "--timeout", "20", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.out[-2000:] + out.err[-2000:]
    doc = json.loads(out.out)
    assert doc["emulation"] == "netns"
    assert max(abs(a - b) for a, b in zip(doc["loss"], doc["reference_loss"])) < 1e-5
    payload = 2 * (2 * 16 * 64 * 4)  # per step: 2 microbatches of 2 x 16 x 64 fp32 each way
    assert doc["bytes_per_link"] == {"stage0(fast)->stage1(slow)": payload, "stage1(slow)->stage0(fast)": payload}
    link = doc["shaped_link"]
    assert link["shaped_Bps"] == 125e6  # cpu-demo's default link: 1 Gbps
    fast, slow = link["kernel_bytes"]["fast"], link["kernel_bytes"]["slow"]
    # one veth pair: what leaves one end arrives at the other, up to a few in-flight/teardown packets (TCP FIN/ACK)
    assert abs(fast["tx"] - slow["rx"]) <= 4 * 1514 and abs(slow["tx"] - fast["rx"]) <= 4 * 1514
    assert fast["tx"] >= 2 * payload and slow["tx"] >= 2 * payload  # 2 steps of payload, plus TCP/gloo overhead
    assert fast["tx"] < 2 * payload + 256 * 1024


def test_netns_needs_two_clusters(tmp_path: Path, capsys) -> None:
    from hetauto.cli import main

    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(_stage("fast", (0, 3)), StagePlan(cluster="fast", device_type="cpu",
                                                                             devices=(1,), layers=(3, 6), tp=1, dp=1)))
    plan.save(tmp_path / "plan.json")
    assert main(["run", str(tmp_path / "plan.json"), "--emulate", "netns"]) != 0
    err = capsys.readouterr().err
    assert ("needs stages on at least two clusters" in err) or ("not available here" in err)


def test_netns_with_max_restarts_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    """Refused with the reason and the alternatives, before the plan is read (no root or namespaces needed)."""
    from hetauto.cli import main

    assert main(["run", str(tmp_path / "absent.json"), "--emulate", "netns", "--max-restarts", "1"]) != 0
    assert capsys.readouterr().err.strip().endswith(
        "--max-restarts is not supported with --emulate netns: each namespace runs its own torchrun, and their "
        "static rendezvous cannot restart the job together; use --emulate (in-process links) with --max-restarts, "
        "or rerun the netns job with --resume CHECKPOINT_DIR after a failure")


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
@pytest.mark.skipif(not AVAIL.ok, reason=f"network namespaces unavailable: {AVAIL.reason}")
def test_sigterm_of_a_netns_run_says_so_and_leaves_no_namespace(tmp_path: Path) -> None:
    """It used to end without a word (issue 30)."""
    import signal

    proc, _ck = _long_netns_run_past_its_first_checkpoint(tmp_path)
    mine = [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True).stdout.splitlines()
            if line.startswith(f"hetauto-{proc.pid}-")]
    assert mine
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    line = err.strip().splitlines()[-1]
    assert line.startswith("hetauto run: error: interrupted by SIGTERM: stopped the namespace job (its node agents, "
                           "torchrun and ranks) and removed its namespaces; newest complete checkpoint: "), line
    assert not any(Path(f"/run/netns/{n}").exists() for n in mine)


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
@pytest.mark.skipif(not AVAIL.ok, reason=f"network namespaces unavailable: {AVAIL.reason}")
def test_ctrl_c_of_a_netns_run_says_what_it_stopped_and_leaves_nothing_running(tmp_path: Path) -> None:
    """It used to say only 'interrupted' (issue 44 item 5)."""
    import signal

    from hetauto.runtime.parent_watch import LAUNCHER_ENV

    proc, ck = _long_netns_run_past_its_first_checkpoint(tmp_path)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT
    line = err.strip().splitlines()[-1]
    assert line.startswith("hetauto run: error: interrupted by SIGINT (Ctrl-C): stopped the namespace job (its node "
                           "agents, torchrun and ranks were killed: nothing of it is left running) and removed its "
                           f"namespaces; newest complete checkpoint: {ck}/step-"), line

    def descendants() -> list[int]:  # processes started for this run (they carry its launcher mark)
        found = []
        for d in Path("/proc").iterdir():
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            marks = [e for e in env if e.startswith(f"{LAUNCHER_ENV}=".encode())]
            if marks and any(m.startswith(f"{proc.pid}:".encode()) for m in marks[0].split(b"=", 1)[1].split(b",")):
                found.append(int(d.name))
        return found

    assert descendants() == []


def _long_netns_run_past_its_first_checkpoint(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A 3000-step `hetauto run --emulate netns` (two namespaces), returned once its first checkpoint is written:
    a job with something to stop and something to keep."""
    import time

    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(_stage("fast", (0, 3)), _stage("slow", (3, 6))))
    plan.save(tmp_path / "plan.json")
    ck = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-m", "hetauto.cli", "run", str(tmp_path / "plan.json"), "--steps", "3000",
                             "--emulate", "netns", "--timeout", "20", "--checkpoint-dir", str(ck), "--no-reference"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 150
    while not (ck / "step-00000000").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end
        time.sleep(0.1)
    return proc, ck
