"""Slow links priced as they behave? Per-boundary transfer time, predicted vs measured, on links shaped for real.

    python benchmarks/link_fidelity.py [--links 0.1x1,1x20,...] [--steps 6] [--runs 3] [--json]

Each link is two network namespaces joined through the TUN delay relay (hetauto.launch.tun_relay: `delay` ms
each way) with tbf at `rate` on both ends (hetauto.launch.netns_topology); default 0.1 and 1 Gbit/s x 1, 20, 70 ms.
Needs root, iproute2 and /dev/net/tun; otherwise it says why and exits 0. On each link:

1. `hetauto profile link`'s measurement (gloo/TCP, hetauto.profiling.link) between the two namespaces at sizes
   around the plan's activation, 1 flow, each transfer after 1 s idle as the plan's boundary sends (`--idle 1`):
   the measured rows.
2. `hetauto run PLAN --emulate netns --trace` of a 2-stage plan (a small GPT, one stage per namespace, one
   microbatch, so each boundary transfer is alone on the link): the executor's own transports over the same
   kind of link (rate and the spec's latency, relayed). Measured per boundary, from the last step's trace: the
   forward and the backward transfer (the send's post -> the receiver's compute start: with one microbatch the
   receiver is waiting for it), their mean.
3. Predicted by the Evaluator for the same boundary (`Evaluator.link_prices`), three ways:
   - `nominal`: the spec's bandwidth and latency only (the old model): latency + bytes / rate;
   - `datasheet`: plus the transport model's window (hetauto.planner.linkmodel): `window` = the kernel's cap on
     one TCP stream's bytes in flight, min(net.ipv4.tcp_rmem[2], net.ipv4.tcp_wmem[2]) read from this host (a
     figure anyone can read off their own hosts; nothing is fitted to the measurements);
   - `rows`: the measured rows of step 1 in the spec (interpolated, never extrapolated).

Printed per link: activation bytes, measured, each prediction and its error, and the whole step's
predicted/measured ratio (`hetauto run`'s own prediction, made with the spec that carries the measured rows);
then MAPE per prediction over the links. `--json`: the last line is one JSON document.

Figures (2026-12-03, 11:32-11:48 UTC, a 2-core host shared with other jobs, load average 5-12; 2 MiB
activations, --runs 3, --steps 6; this host runs BBR, so the datasheet spec says slow_start_after_idle: false):

         link  measured   nominal        datasheet        rows            step p/m
    0.1Gb/s 1ms    167.8ms  168.8ms  +0.6%  168.8ms  +0.6%  168.0ms  +0.2%  0.93
    0.1Gb/s 20ms   187.6ms  187.8ms  +0.1%  187.8ms  +0.1%  187.0ms  -0.3%  0.70
    0.1Gb/s 70ms   278.1ms  237.8ms -14.5%  237.8ms -14.5%  240.5ms -13.5%  0.77
    1Gb/s 1ms       20.2ms   17.8ms -12.1%   17.8ms -12.1%   16.5ms -18.5%  0.89
    1Gb/s 20ms      41.8ms   36.8ms -12.0%   40.0ms  -4.3%   42.4ms  +1.3%  1.26
    1Gb/s 70ms     147.8ms   86.8ms -41.3%  140.0ms  -5.3%  150.2ms  +1.6%  1.03
    MAPE per boundary: nominal 13.4%, datasheet 6.2%, rows 5.9%

Both targets are met on this run (datasheet <= 20%, rows <= 10%); one run on a loaded host (0.1 Gbit/s, 70 ms:
the three runs' transfers were 264, 450 and 278 ms). Before (same day, the setup below undone): nominal 25.9%,
datasheet 21.9%, rows 18.8%. What changed is mostly the measurement, not the model:
- the relay's MTU was 65000: one segment (MSS 64948) is then a fresh connection's whole receive window, so a
  young connection's window opened a segment per round trip, and 3-step runs measured that ramp (now 9000,
  hetauto.launch.netns_topology; and 6 steps, so the measured transfer's connection is warm, as in training);
- the relay waited for the CPU behind the ranks (now nice -10) and spun on poll()'s millisecond timeout;
- the rows were measured back to back after warming with 4 MiB messages, while the plan's boundary sends one
  2 MiB message per direction per step after ~1 s idle; under BBR a transfer's pacing follows what the recent
  transfers reached, so 2 MiB took 108 ms back to back after 1 MiB ones and 145 ms as the plan sends it at
  1 Gbit/s, 70 ms. Rows are now measured with `--idle 1` (PROFILE_IDLE_S), each size warmed with itself;
- the rows' ack correction (half a one-byte ping-pong) came out too large on a loaded host (rows below what
  the rate allows: 512 KiB in 0.0 ms at 1 Gbit/s); it is now half of the same send-and-ack at one byte;
- TCP's slow start after idle, which the model applies with a window, does not happen under BBR (Linux skips
  the restart for a congestion control with its own cong_control): 2 MiB after 2 s idle took 136-138 ms at
  1 Gbit/s, 70 ms, as back to back. The datasheet spec reads this off the host (kernel_restarts_after_idle).
Left: the model knows nothing of tbf's bucket (at 1 Gbit/s its 250 KB burst is 2 ms early) nor of BBR's pacing
after idle (0.1 Gbit/s, 70 ms is measured ~15% slower than the rate allows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LINKS = ((0.1, 1.0), (0.1, 20.0), (0.1, 70.0), (1.0, 1.0), (1.0, 20.0), (1.0, 70.0))  # Gbit/s, ms one way
# untied: a tied embedding's gradient sum at the step's end would send data both ways over the boundary's own TCP
# connection, so the next step's first transfer would not start idle
MODEL = {"model_type": "gpt2", "n_layer": 2, "n_embd": 512, "n_head": 8, "vocab_size": 256, "n_positions": 256,
         "tie_word_embeddings": False}
SEQ, MICROBATCH = 256, 4  # activation: 4 x 256 x 512 fp32 = 2 MiB per transfer
PORT = 29610
# the plan sends one microbatch per step, so each direction idles a whole step (> 1 s here) before its transfer,
# longer than any of these links' RTO (RTT + 200 ms <= 340 ms): the rows are measured after such an idle gap
PROFILE_IDLE_S = 1.0
RELAY_MTU = 9000  # hetauto.launch.netns_topology's TUN devices (NamespaceTopology's default mtu)


def kernel_window() -> int:
    """Bytes one TCP stream may have in flight here: the smaller of the receive and send buffer caps."""
    def top(name: str) -> int:
        return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[-1])

    return min(top("tcp_rmem"), top("tcp_wmem"))


def kernel_restarts_after_idle() -> bool:
    """Whether an idle TCP stream here restarts from its initial window: net.ipv4.tcp_slow_start_after_idle,
    and a congestion control without its own `cong_control` (Linux's tcp_slow_start_after_idle_check returns
    early for one that has it: BBR keeps its window and paces at its bandwidth estimate after idle)."""
    on = Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle").read_text().strip() == "1"
    return on and Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip() != "bbr"


def spec_doc(gbps: float, ms: float, window: int | None = None, rows: list[dict] | None = None) -> dict[str, Any]:
    link: dict[str, Any] = {"bandwidth": f"{gbps:g}Gbps", "latency": f"{ms:g}ms", "shared_capacity": f"{gbps:g}Gbps"}
    if window is not None:  # the transport model's figures: this host's window cap and restart, the TUN's MTU
        link["window"] = f"{window}B"
        link["mtu"] = RELAY_MTU
        link["slow_start_after_idle"] = kernel_restarts_after_idle()
    if rows:
        link["measured"] = rows
    return {"clusters": [{"name": n, "nodes": {"count": 1, "devices_per_node": 1, "device": "cpu"}}
                         for n in ("a", "b")], "links": {"default": link}}


def write_plan(folder: Path, spec: dict[str, Any]) -> Path:
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan

    (folder / "config.json").write_text(json.dumps(MODEL))
    (folder / "cluster.json").write_text(json.dumps(spec))
    n = MODEL["n_layer"] + 2
    stages = (StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, n // 2), tp=1, dp=1),
              StagePlan(cluster="b", device_type="cpu", devices=(0,), layers=(n // 2, n), tp=1, dp=1))
    plan = Plan(model=str(folder / "config.json"), cluster=str(folder / "cluster.json"), seq_len=SEQ, global_batch=MICROBATCH,
                microbatch_size=MICROBATCH, num_microbatches=1, stages=stages, schedule=ScheduleSpec(name="1f1b"))
    path = folder / "plan.json"
    plan.save(path)
    return path


def predicted(plan_path: Path) -> dict[str, Any]:
    """The Evaluator's one-way time of boundary 0 for one microbatch, and how it was priced."""
    from hetauto.core.plan import Plan
    from hetauto.planner.evaluate import Evaluator, inputs_for_plan, resolve_plan_paths

    plan = resolve_plan_paths(Plan.load(plan_path), plan_path.parent)
    ev = Evaluator(inputs_for_plan(plan))
    (b,) = ev.link_prices(plan)
    return {"seconds": b.seconds, "bytes": b.flow_bytes, "source": b.source, "detail": b.detail}


def _profile(rank: int, world_size: int, sizes: list[int], repeats: int, idle_s: float) -> list[dict[str, Any]]:
    """One side of `hetauto profile link --idle IDLE_S` inside its namespace (run_in_namespaces calls it)."""
    from hetauto.profiling.link import measure_link

    got = measure_link(os.environ["MASTER_ADDR"], PORT, rank, sizes, [1], repeats=repeats, timeout_s=120,
                       idle_s=idle_s)
    return [{"bytes": r.nbytes, "flows": r.flows, "seconds": r.seconds,
             **({"idle": f"{r.idle_s:g}s"} if r.idle_s else {})} for r in got.rows]


def measured_rows(gbps: float, ms: float, nbytes: float, repeats: int) -> list[dict[str, Any]]:
    from hetauto.launch.netns_topology import NamespaceTopology, run_in_namespaces

    sizes = sorted({int(nbytes // 4), int(nbytes // 2), int(nbytes), int(nbytes * 2)})
    with NamespaceTopology([[0], [1]], gbps * 1e9 / 8, delay_s=ms / 1e3) as topo:
        return run_in_namespaces(topo, f"{__file__}:_profile", [sizes, repeats, PROFILE_IDLE_S], timeout=600)[0]


def executor_run(plan_path: Path, steps: int) -> dict[str, Any]:
    """`hetauto run --emulate netns` of the plan: per-boundary transfer times of its last step and its step."""
    trace = plan_path.parent / "trace.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    got = subprocess.run([sys.executable, "-m", "hetauto", "run", str(plan_path), "--emulate", "netns", "--steps",
                          str(steps), "--no-reference", "--trace", str(trace), "--timeout", "120", "--json"],
                         capture_output=True, text=True, env=env, timeout=1200, cwd=plan_path.parent)
    if got.returncode != 0:
        raise RuntimeError((got.stdout + got.stderr).strip().splitlines()[-1])
    doc = json.loads(got.stdout)
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    start = {(names[e["tid"]], e["name"]): e["ts"] / 1e6 for e in events if e.get("ph") == "X"}
    try:
        # with one microbatch each receiver waits for its input and starts computing the moment it lands, so a
        # transfer is: the receiver's compute start - the send's post. (The trace's link tracks end at the first
        # completion either side saw; over TCP a send completes once its bytes are in the socket buffer, so
        # the sender's sighting can precede delivery by the whole transfer.)
        fwd = start[("stage 1", "F0")] - start[("link 0->1", "SEND_F0")]
        bwd = start[("stage 0", "B0")] - start[("link 1->0", "SEND_B0")]
    except KeyError as err:
        raise RuntimeError(f"the run's trace lacks {err}") from None
    return {"forward_s": fwd, "backward_s": bwd, "transfer_s": (fwd + bwd) / 2,
            "measured_step_s": doc["measured_step_s"], "predicted_step_s": doc["predicted_step_s"]}


def one_link(gbps: float, ms: float, steps: int, repeats: int, runs: int = 3) -> dict[str, Any]:
    window = kernel_window()
    with tempfile.TemporaryDirectory(prefix="hetauto-linkfid-") as tmp:
        folder = Path(tmp)
        nominal = predicted(write_plan(folder, spec_doc(gbps, ms)))
        datasheet = predicted(write_plan(folder, spec_doc(gbps, ms, window)))
        rows = measured_rows(gbps, ms, nominal["bytes"], repeats)
        plan_path = write_plan(folder, spec_doc(gbps, ms, window, rows))
        with_rows = predicted(plan_path)
        tries = [executor_run(plan_path, steps) for _ in range(runs)]
    # the median run by transfer time (a loaded host slows single transfers at random)
    run = sorted(tries, key=lambda r: r["transfer_s"])[len(tries) // 2]
    m = run["transfer_s"]

    def err(p: dict[str, Any]) -> float:
        return (p["seconds"] - m) / m

    return {"gbps": gbps, "delay_ms": ms, "bytes": nominal["bytes"], "window": window, "measured_s": m,
            "measured_forward_s": run["forward_s"], "measured_backward_s": run["backward_s"],
            "nominal_s": nominal["seconds"], "nominal_err": err(nominal),
            "datasheet_s": datasheet["seconds"], "datasheet_err": err(datasheet), "datasheet_detail": datasheet["detail"],
            "rows_s": with_rows["seconds"], "rows_err": err(with_rows), "rows_source": with_rows["source"],
            "rows": rows, "step_measured_s": run["measured_step_s"], "step_predicted_s": run["predicted_step_s"],
            "step_ratio": run["predicted_step_s"] / run["measured_step_s"] if run["predicted_step_s"] else None,
            "runs_transfer_s": [r["transfer_s"] for r in tries]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--links", default=",".join(f"{g:g}x{d:g}" for g, d in LINKS),
                    help="comma-separated GBPSxMS links (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=6,
                    help="steps per executor run; the last one is measured (%(default)s: its connection is warm, "
                         "as a training run's steady steps are)")
    ap.add_argument("--repeats", type=int, default=3, help="tries per measured row (median)")
    ap.add_argument("--runs", type=int, default=3, help="executor runs per link (the median transfer's is kept)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from hetauto.launch.netns_topology import available

    avail = available()
    if not avail.ok or not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        print(f"link_fidelity: skipped: {avail.reason if not avail.ok else '/dev/net/tun is not usable'}")
        return 0
    links = [tuple(float(x) for x in item.split("x")) for item in args.links.split(",")]
    out = []
    print(f"{'link':>12} {'bytes':>9} {'measured':>9} {'nominal':>16} {'datasheet':>16} {'rows':>16} {'step p/m':>8}")
    for gbps, ms in links:
        r = one_link(gbps, ms, args.steps, args.repeats, args.runs)
        out.append(r)
        ratio = "-" if r["step_ratio"] is None else f"{r['step_ratio']:.2f}"
        print(f"{gbps:g}Gb/s {ms:g}ms".rjust(12) + f" {r['bytes']:9.3g} {r['measured_s'] * 1e3:8.1f}ms"
              + "".join(f" {r[k + '_s'] * 1e3:7.1f}ms {r[k + '_err']:+6.1%}" for k in ("nominal", "datasheet", "rows"))
              + f" {ratio:>8}", flush=True)
    summary = {k: statistics.mean(abs(r[k + "_err"]) for r in out) for k in ("nominal", "datasheet", "rows")}
    print("MAPE per boundary: " + ", ".join(f"{k} {v:.1%}" for k, v in summary.items()))
    if args.json:
        print(json.dumps({"links": out, "mape": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
