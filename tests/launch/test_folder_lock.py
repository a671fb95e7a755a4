"""One owner per checkpoint folder (issue 30): a second run is refused before launch with one line naming the
owner; the lock of a run that is gone (SIGKILLed) is taken over and said so; the lock goes when the run ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetauto.core.errors import CheckpointError
from hetauto.core.plan import Plan, StagePlan
from hetauto.launch.folder_lock import LOCK_FILE, FolderOwner, acquire_folder

CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""
HOLD = ("import sys, time\n"
        "from hetauto.launch.folder_lock import acquire_folder\n"
        "lock = acquire_folder(sys.argv[1], run_id='holder')\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_second_owner_is_refused_naming_the_first(tmp_path: Path) -> None:
    with acquire_folder(tmp_path, run_id="first") as lock:
        with pytest.raises(CheckpointError) as err:
            acquire_folder(tmp_path)
        assert str(err.value) == (f"--checkpoint-dir {tmp_path} is in use by {lock.owner.describe()}: two runs writing "
                                  "one folder replace each other's checkpoints; wait for it to end or choose another "
                                  "--checkpoint-dir")
        assert f"pid {os.getpid()} on host {socket.gethostname()} (run first, since " in lock.owner.describe()
    assert not (tmp_path / LOCK_FILE).exists()  # released


def test_lock_of_a_dead_owner_is_taken_over_and_one_from_another_host_is_not(tmp_path: Path) -> None:
    gone = FolderOwner(host=socket.gethostname(), pid=_dead_pid(), run_id="gone", started_unix=1.0, pid_start="1")
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": gone.host, "pid": gone.pid, "run_id": "gone",
                                                  "started_unix": 1.0, "pid_start": "1"}))
    with acquire_folder(tmp_path) as lock:
        assert lock.took_over == gone
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    far = {"host": "elsewhere", "pid": 1, "run_id": "far", "started_unix": 1.0, "pid_start": None}
    (tmp_path / LOCK_FILE).write_text(json.dumps(far))
    with pytest.raises(CheckpointError) as err:
        acquire_folder(tmp_path)
    assert str(err.value) == (f"--checkpoint-dir {tmp_path} is in use by pid 1 on host elsewhere (run far, since "
                              "1970-01-01 00:00:01 UTC), another host: two runs writing one folder replace each "
                              f"other's checkpoints; choose another --checkpoint-dir, or remove {tmp_path / LOCK_FILE} "
                              "once that run has ended")
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == far  # nothing of the owner's is touched


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_hetauto_run_is_refused_while_another_owns_the_folder_and_takes_over_after_kill_9(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(CLUSTER)
    Plan(model="tiny-gpt", cluster="one.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=(StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1),)
         ).save(tmp_path / "plan.json")
    ck = tmp_path / "ck"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(ck)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        cmd = [sys.executable, "-m", "hetauto.cli", "run", str(tmp_path / "plan.json"), "--steps", "1",
               "--checkpoint-dir", str(ck), "--no-reference", "--json"]
        t0 = time.monotonic()
        refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        owner = json.loads((ck / LOCK_FILE).read_text())
        assert refused.returncode == 5
        assert json.loads(refused.stdout) == {"error": (
            f"--checkpoint-dir {ck} is in use by pid {holder.pid} on host {socket.gethostname()} "
            f"(run holder, since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(owner['started_unix']))}): two "
            "runs writing one folder replace each other's checkpoints; wait for it to end or choose another "
            "--checkpoint-dir")}
        assert not any(ck.glob("step-*"))  # refused before launch
        refused_s = time.monotonic() - t0
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        ok = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    finally:
        holder.kill()
        holder.wait()
    assert ok.returncode == 0, ok.stderr
    assert (f"hetauto run: note: took over --checkpoint-dir {ck} from a run that is gone (pid {holder.pid} on host "
            f"{socket.gethostname()} (run holder, since ") in ok.stderr
    assert [p.name for p in ck.glob("step-*")] == ["step-00000000"] and not (ck / LOCK_FILE).exists()
    print(f"refused in {refused_s:.1f} s")
