"""Launching across sites, measured: `python benchmarks/launch.py [--json]` (root: network namespaces).

Prints, side by side in one run:
- the control plane's cost per message (a rank's post to the lead's store, read and mirrored into the run folder)
  next to what a rank's file append cost before it (the one-host file protocol), and both as a share of the
  measured step of the same two-site plan: the ratio (step + store messages) / (step + file appends);
- two sites as network namespaces started from `hetauto launch --target torchrun` scripts: seconds from start to
  the first step on the lead;
- the time from SIGSTOP of a rank on the non-lead site to the lead's verdict naming it (at --timeout 5), and the
  time to name a site that never starts (at --join-timeout 3).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from hetauto.cli import main as cli
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime import netns

CLUSTER = """\
clusters:
  - {name: fast, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: slow, nodes: {count: 1, devices_per_node: 4, device: cpu}, backend: mock}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""
MESSAGES_PER_STEP = 2  # the last stage's step lines (dp 3: three; one step message each) + heartbeats are async


def control_cost(n: int = 2000) -> tuple[float, float]:
    """Seconds per message through the control store (post + mirror) and per file append."""
    from hetauto.launch.control import ControlServer
    from hetauto.runtime.control import ControlClient

    with tempfile.TemporaryDirectory() as tmp:
        server = ControlServer(tmp).start()
        client = ControlClient(server.address, 0)
        line = json.dumps({"step": 1, "loss": 5.0, "lr": 1e-3, "grad_norm": 1.0, "step_s": 0.1, "eval_loss": None})
        t0 = time.perf_counter()
        for _ in range(n):
            client.post("step", line)
        server.close()
        store_s = (time.perf_counter() - t0) / n
        path = Path(tmp) / "append.jsonl"
        t0 = time.perf_counter()
        for _ in range(n):
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        file_s = (time.perf_counter() - t0) / n
    return store_s, file_s


def _plan(folder: Path) -> Path:
    (folder / "sites.yaml").write_text(CLUSTER, encoding="utf-8")
    stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="slow", device_type="cpu", devices=(0, 1, 2), layers=(3, 6), tp=1, dp=3))
    Plan(model="tiny-gpt", cluster="sites.yaml", seq_len=16, global_batch=6, microbatch_size=3, num_microbatches=2,
         stages=stages).save(folder / "plan.json")
    return folder / "plan.json"


def _sites(root: Path, topo: netns.NamespaceTopology, *extra: str, start: tuple[int, ...] = (0, 1)) -> list:
    out = root / "launch"
    argv = ["launch", str(_plan(root)), "--master", f"{topo.addresses[0]}:29500", "-o", str(out), "--iface",
            f"fast={topo.interfaces[0]}", "--iface", f"slow={topo.interfaces[1]}", *extra]
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
            import contextlib

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
        import contextlib

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
        import contextlib

        with contextlib.redirect_stdout(open(os.devnull, "w")):
            t0 = time.monotonic()
            procs = _sites(Path(tmp), topo, "--join-timeout", "3", start=(0,))
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
    ratio = (step + MESSAGES_PER_STEP * store_s) / (step + MESSAGES_PER_STEP * file_s)
    out = {"store_message_us": store_s * 1e6, "file_append_us": file_s * 1e6, **sites,
           "control_cost_ratio": ratio, "hung_rank_detect_s_at_timeout_5": hung_rank(),
           "missing_site_detect_s_at_join_timeout_3": missing_site()}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"control store: {out['store_message_us']:.0f} us per message vs file append {out['file_append_us']:.0f} us; "
          f"step {step:.3f} s -> ratio {ratio:.4f} (target <= 1.02)")
    print(f"two netns sites from the torchrun scripts: first step after {out['start_to_first_step_s']:.1f} s "
          f"(loss vs reference {out['max_loss_diff']:.1g})")
    print(f"hung rank on the non-lead site named {out['hung_rank_detect_s_at_timeout_5']:.1f} s after SIGSTOP "
          "(--timeout 5; target <= 10)")
    print(f"missing site named {out['missing_site_detect_s_at_join_timeout_3']:.1f} s after start "
          "(--join-timeout 3; target <= 8)")


if __name__ == "__main__":
    main()
