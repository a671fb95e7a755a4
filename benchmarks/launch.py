"""Launching across sites, measured: `python benchmarks/launch.py [--json]` (root: network namespaces).

Prints, side by side in one run:
- the control plane's cost per step line on a rank's training thread (a post to the lead's store, sent by the
  rank's sender thread, read and mirrored into the run folder) next to a file append (the one-host protocol before
  it), and side by side a loop of compute steps as long as the two-site plan's measured step, posting its step
  lines either way: the ratio of wall times (store / file; the mirror runs in the same process, so this is the
  pessimistic case);
- two sites as network namespaces started from `hetauto launch --target torchrun` scripts: seconds from start to
  the first step on the lead;
- the time from SIGSTOP of a rank on the non-lead site to the lead's exit with the verdict naming it (at
  --timeout 5), and from the lead agent's start to its exit naming a site that never starts (at --join-timeout 3).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hetauto.cli import main as cli
from hetauto.launch import netns_topology as netns
from hetauto.testing.two_sites import write_two_site_plan

MESSAGES_PER_STEP = 3  # the last stage's step lines (dp 3: one per rank); heartbeats have their own thread


_TOKEN = "ab" * 32  # the job's control-store token (hetauto.launch.local.control_token_file makes a random one)


def control_cost(n: int = 2000) -> tuple[float, float]:
    """Seconds per message a rank's training thread pays: a step line posted to the control store (queued; the
    sender thread talks to the store) and, before it, a step line appended to a file (the one-host protocol)."""
    from hetauto.launch.control import ControlServer
    from hetauto.runtime.control import ControlClient

    line = json.dumps({"step": 1, "loss": 5.0, "lr": 1e-3, "grad_norm": 1.0, "step_s": 0.1, "eval_loss": None})
    with tempfile.TemporaryDirectory() as tmp, ControlServer(tmp, token=_TOKEN) as server:
        client = ControlClient(server.address, 0, token=_TOKEN)  # authenticated, as every job's store is
        t0 = time.perf_counter()
        for _ in range(n):
            client.post("step", line)
        store_s = (time.perf_counter() - t0) / n
        client.flush()
        path = Path(tmp) / "append.jsonl"
        t0 = time.perf_counter()
        for _ in range(n):
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        file_s = (time.perf_counter() - t0) / n
    return store_s, file_s


@contextlib.contextmanager
def _server_process(folder: str):
    """A ControlServer in its own process (mirroring into `folder`) until the block ends; yields its address."""
    code = ("import sys; from hetauto.launch.control import ControlServer\n"
            f"with ControlServer(sys.argv[1], token={_TOKEN!r}) as s:\n    print(s.address, flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, folder], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        yield proc.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait()


def loop_ratio(step_s: float, steps: int = 8, pairs: int = 25) -> float:
    """The whole cost side by side: loops of `steps` compute steps of ~step_s (a one-thread matmul chain), each
    step posting MESSAGES_PER_STEP step lines to the control store (its sender thread included; the store and
    its mirror run in another process, as the lead's agent does) vs appending them to a file. Counted in this
    process's CPU seconds, not wall time, so the other programs on the machine do not enter; the median over
    `pairs` alternated pairs of store / file."""
    import statistics

    import torch

    from hetauto.runtime.control import ControlClient

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    t0 = time.process_time()
    for _ in range(20):
        a = torch.tanh(a @ a)
    reps = max(1, round(step_s / ((time.process_time() - t0) / 20)))
    line = json.dumps({"step": 1, "loss": 5.0, "lr": 1e-3, "grad_norm": 1.0, "step_s": step_s, "eval_loss": None})

    def run(send, flush) -> float:
        x = torch.randn(256, 256)
        t = time.process_time()
        for _ in range(steps):
            for _ in range(reps):
                x = torch.tanh(x @ x)
            for _ in range(MESSAGES_PER_STEP):
                send(line)
        flush()
        return time.process_time() - t

    with tempfile.TemporaryDirectory() as tmp, _server_process(tmp) as address:
        client = ControlClient(address, 0, token=_TOKEN)
        path = Path(tmp) / "append.jsonl"

        def append(text: str) -> None:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")

        ratios = []
        for i in range(pairs):
            store = lambda: run(lambda text: client.post("step", text), client.flush)  # noqa: E731
            files = lambda: run(append, lambda: None)  # noqa: E731
            if i % 2:
                f, s = files(), store()
            else:
                s, f = store(), files()
            ratios.append(s / f)
    return statistics.median(ratios)


def _sites(root: Path, topo: netns.NamespaceTopology, *extra: str, start: tuple[int, ...] = (0, 1)) -> list:
    out = root / "launch"
    argv = ["launch", str(write_two_site_plan(root)), "--master", f"{topo.addresses[0]}:29500", "-o", str(out),
            "--iface", f"fast={topo.interfaces[0]}", "--iface", f"slow={topo.interfaces[1]}", *extra]
    assert cli(argv) == 0
    procs = []
    for g in start:
        work = root / f"site{g}"
        work.mkdir()
        script = out / ("fast/node0.sh" if g == 0 else "slow/node1.sh")
        procs.append(subprocess.Popen(["ip", "netns", "exec", topo.namespaces[g], "bash", str(script)], cwd=work,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    return procs


def _lead(root: Path) -> Path | None:
    return next((root / "site0").glob("hetauto-job-*-node0"), None)


def two_sites(steps: int = 20) -> dict:
    figures = {}
    with tempfile.TemporaryDirectory() as tmp, netns.NamespaceTopology([[0], [1, 2, 3]], 125e6) as topo:
        root = Path(tmp)
        with open(os.devnull, "w") as null:
            with contextlib.redirect_stdout(null):
                t0 = time.monotonic()
                procs = _sites(root, topo, "--steps", str(steps), "--timeout", "30")
        first = None
        while procs[0].poll() is None:
            lead = _lead(root)
            if first is None and lead is not None and (lead / "steps.jsonl").is_file() and \
                    (lead / "steps.jsonl").read_text():
                first = time.monotonic() - t0
            time.sleep(0.05)
        for p in procs:
            p.wait()
        doc = json.loads((_lead(root) / "result.json").read_text())  # type: ignore[operator]
        figures.update(start_to_first_step_s=first, measured_step_s=doc["measured_step_s"],
                       max_loss_diff=doc["max_loss_diff"])
    return figures


def hung_rank() -> float:
    with tempfile.TemporaryDirectory() as tmp, netns.NamespaceTopology([[0], [1, 2, 3]], 125e6) as topo:
        root = Path(tmp)
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            procs = _sites(root, topo, "--steps", "400", "--timeout", "5")
        while True:
            lead = _lead(root)
            if lead is not None and (lead / "steps.jsonl").is_file() and (lead / "run" / "rank2.started").is_file():
                break
            time.sleep(0.1)
        pid = int((lead / "run" / "rank2.started").read_text().split("pid")[1])
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = procs[0].communicate()
        took = time.monotonic() - t0
        procs[1].wait()
        assert "rank 2 (stage 1, cluster 'slow') stopped responding" in err, err[-500:]
        return took


def missing_site() -> float:
    with tempfile.TemporaryDirectory() as tmp, netns.NamespaceTopology([[0], [1, 2, 3]], 125e6) as topo:
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            procs = _sites(Path(tmp), topo, "--join-timeout", "3", start=(0,))
        t0 = time.monotonic()  # the lead's agent has just been started (the launch files are written)
        _, err = procs[0].communicate()
        assert "missing site 'slow' node rank(s) 1" in err, err[-500:]
        return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    store_s, file_s = control_cost()
    sites = two_sites()
    step = sites["measured_step_s"]
    ratio = loop_ratio(step)
    out = {"store_message_us": store_s * 1e6, "file_append_us": file_s * 1e6, **sites,
           "control_cost_ratio": ratio, "hung_rank_detect_s_at_timeout_5": hung_rank(),
           "missing_site_detect_s_at_join_timeout_3": missing_site()}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"control store: {out['store_message_us']:.0f} us per step line on the training thread vs file append "
          f"{out['file_append_us']:.0f} us; {MESSAGES_PER_STEP} lines per {step:.3f} s step, side by side: "
          f"ratio {ratio:.4f} (target <= 1.02)")
    print(f"two netns sites from the torchrun scripts: first step after {out['start_to_first_step_s']:.1f} s "
          f"(loss vs reference {out['max_loss_diff']:.1g})")
    print(f"hung rank on the non-lead site named {out['hung_rank_detect_s_at_timeout_5']:.1f} s after SIGSTOP "
          "(--timeout 5; target <= 10)")
    print(f"missing site named {out['missing_site_detect_s_at_join_timeout_3']:.1f} s after start "
          "(--join-timeout 3; target <= 8)")


if __name__ == "__main__":
    main()
