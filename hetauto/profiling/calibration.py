"""The calibration's probes: measure what this machine's executor costs beyond the analytical model.

What is measured and why is told in `hetauto.planner.calibration` (which holds the values, the cache file and
the pure fits); this module runs the measurements: gloo latency and bandwidth, DTensor's per-block cost, the
thread-CPU-time probes (in turns, beside busy cores), the quick GEMM profile, and the executor's own runs of
the reference plans. It lives in hetauto/profiling/ because it runs the runtime, the profiler and the backends,
which the planner never imports. `measure_calibration()` measures (~75 s here); `ensure_calibration()` reads the
cache and measures only when it is absent or stale.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hetauto.core.profile import DeviceProfile
from hetauto.planner.calibration import (Calibration, Overheads, allreduce_bandwidth, cache_path, compute_scale_for,
                                         is_stale, local_calibration, optimizer_fit, per_block_slope,
                                         read_calibration_document, reference_pipeline, reference_plan,
                                         save_calibration, step_residual, torch_version, tp_cpu_fraction)

__all__ = ["CALIBRATION_PHASES", "available_cores", "busy_host", "ensure_calibration", "host_level",
           "measure_calibration"]


def ensure_calibration(*, cache_dir: str | Path | None = None) -> Calibration:
    """The cached calibration, measured (tens of seconds) and written first when absent or written before one of
    today's Overheads terms existed."""
    path = cache_path(cache_dir)
    if path.is_file() and not is_stale(read_calibration_document(path)):
        cal = local_calibration(cache_dir=cache_dir)
        assert cal is not None
        return cal
    cal = measure_calibration()
    save_calibration(cal, cache_dir)
    return cal


def _median_time(fn: Any, repeat: int, clock: Any = time.perf_counter, q: float = 0.5) -> float:
    """The `q` quantile (median by default) of `repeat` timings of `fn`."""
    ts = []
    for _ in range(repeat):
        t = clock()
        fn()
        ts.append(clock() - t)
    return statistics.median(ts) if q == 0.5 else _quantile(ts, q)


GLOO_QUANTILE = 0.2  # wall-clock gloo timings: a low quantile, the exchange when both ranks are scheduled
AR_PROBE_BYTES = 1 << 20  # all-reduce size for the bandwidth term: about a tiny model's fp32 gradients


def _comm_alphas(rank: int, world: int, repeat: int) -> tuple[float, float, float, float]:
    """Low quantiles per message (a shared machine deschedules some; a mean would charge every message for them):
    one-way p2p of a tiny tensor (half a ping-pong), a tiny all-reduce, an AR_PROBE_BYTES all-reduce; and the
    median of that all-reduce issued right after a fixed amount of compute, as the executor's REDUCE_GRAD
    follows the last backward (each rank arrives on its own; gloo's threads have gone to sleep)."""
    import torch

    from hetauto.core.comm import Communicator

    comm = Communicator.init_from_env("gloo", timeout_s=60)
    x = torch.zeros(1)
    big = torch.zeros(AR_PROBE_BYTES // 4)

    def pingpong() -> None:
        if rank == 0:
            comm.send(x, 1)
            comm.recv(x, 1)
        else:
            comm.recv(x, 0)
            comm.send(x, 0)

    comm.barrier()
    p2p = _median_time(pingpong, repeat, q=GLOO_QUANTILE) / 2
    comm.barrier()
    ar = _median_time(lambda: comm.all_reduce(x), repeat, q=GLOO_QUANTILE)
    comm.barrier()
    ar_big = _median_time(lambda: comm.all_reduce(big), max(9, repeat // 5), q=GLOO_QUANTILE)
    comm.barrier()
    a = torch.randn(128, 128)
    after = []
    for _ in range(max(9, repeat // 10)):
        for _ in range(40):  # fixed work (~ms), no barrier: the ranks' own skew is part of what is measured
            a = torch.tanh(a @ a)
        t = time.perf_counter()
        comm.all_reduce(big)
        after.append(time.perf_counter() - t)
    comm.destroy()
    return p2p, ar, ar_big, statistics.median(after)


def _tp_block_overheads(rank: int, world: int, repeat: int) -> tuple[float, float, float, float, float]:
    """Two ranks, tp = 2 (DTensor, as the executor shards a stage): extra forward / backward time per block
    over the same unsharded stage timed in the same processes (1 sample x seq 32, where FLOPs are negligible).
    Returns (fwd wall, bwd wall, fwd CPU, bwd CPU, optimizer step CPU) per block. The F/B CPU is the process's
    (gloo's own threads move the collectives' bytes: ~1/4 more than the main thread's time, and a core is just
    as busy with them); the optimizer's the main thread's. The last: AdamW over
    DTensor parameters (each elementwise op dispatched through DTensor, ~10x a plain tensor's). Wall time is what an executor action lasts:
    DTensor's dispatch work (~8 / 15 ms per block here, its CPU time) plus waiting on its many small gloo
    collectives (about as much again); the median (an action in a run meets the partner's delays as often as
    this loop does; a low quantile kept only the lucky exchanges and came out ~15% short)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.stage import build_stage
    from hetauto.runtime.tensor_parallel import parallelize_stage

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    cfg = get_model("tiny-gpt")
    mesh = DeviceMesh("cpu", list(range(world)))
    # the four stages (1 and 3 blocks, plain and sharded) timed in turns, so a slow spell of the host hits all
    # of them alike (in blocks, the per-block terms varied 1.5x between calibrations)
    probes = [(blocks, sharded, parallelize_stage(build_stage(cfg, (1, 1 + blocks), 0), mesh) if sharded
               else build_stage(cfg, (1, 1 + blocks), 0)) for blocks in (1, 3) for sharded in (False, True)]
    x = torch.randn(1, 32, cfg.hidden, requires_grad=True)
    samples: dict[tuple[int, bool], dict[str, list[float]]] = {
        (b, sh): {"fw": [], "bw": [], "fc": [], "bc": []} for b, sh, _ in probes}
    for i in range(repeat + 2):
        for blocks, sharded, st in probes:
            dist.barrier()
            t, c = time.perf_counter(), time.process_time()
            y = st(x)
            t1, c1 = time.perf_counter(), time.process_time()
            y.sum().backward()
            t2, c2 = time.perf_counter(), time.process_time()
            if i >= 2:  # the first calls build DTensor's sharding-propagation caches
                got = samples[(blocks, sharded)]
                got["fw"].append(t1 - t)
                got["bw"].append(t2 - t1)
                got["fc"].append(c1 - c)
                got["bc"].append(c2 - c1)
    med = {k: {q: statistics.median(v) for q, v in d.items()} for k, d in samples.items()}
    extra: dict[tuple[int, str], tuple[float, float]] = {}
    for blocks in (1, 3):
        plain, sharded = med[(blocks, False)], med[(blocks, True)]
        extra[(blocks, "wall")] = (max(0.0, sharded["fw"] - plain["fw"]), max(0.0, sharded["bw"] - plain["bw"]))
        extra[(blocks, "cpu")] = (max(0.0, sharded["fc"] - plain["fc"]), max(0.0, sharded["bc"] - plain["bc"]))
    opt = _optimizer_step_times([list(st.parameters()) for _, _, st in probes], repeat, GLOO_QUANTILE, torch.zeros_like)
    opt_extra = {1: max(0.0, opt[1] - opt[0]), 3: max(0.0, opt[3] - opt[2])}
    dist.destroy_process_group()
    return (per_block_slope(extra[(1, "wall")][0], extra[(3, "wall")][0]),
            per_block_slope(extra[(1, "wall")][1], extra[(3, "wall")][1]),
            per_block_slope(extra[(1, "cpu")][0], extra[(3, "cpu")][0]),
            per_block_slope(extra[(1, "cpu")][1], extra[(3, "cpu")][1]),
            per_block_slope(opt_extra[1], opt_extra[3]))


def _timed_optimizer_step(params: list[Any], opt: Any, grad_like: Any) -> float:
    """One optimizer step (then zero_grad) over `params` with gradients `grad_like(p)`, in thread CPU time."""
    import torch

    with torch.no_grad():
        for p in params:
            p.grad = grad_like(p)
    c = time.thread_time()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.thread_time() - c


def _optimizer_step_times(param_sets: list[list[Any]], repeat: int, q: float, grad_like: Any) -> list[float]:
    """Per parameter set, the `q` quantile of the executor's optimizer step (make_optimizer: single-tensor
    AdamW, then zero_grad) in thread CPU time, after 3 warm-up steps (they allocate the moments). The sets
    are timed in turn, so a slow phase of the host hits all of them alike; gradients from `grad_like(p)`."""
    from hetauto.runtime.reference import make_optimizer

    probes = [(params, make_optimizer(params, 1e-3), []) for params in param_sets]
    for i in range(repeat + 3):
        for params, opt, ts in probes:
            t = _timed_optimizer_step(params, opt, grad_like)
            if i >= 3:
                ts.append(t)
    return [_quantile(ts, q) for _, _, ts in probes]


OPTIM_PROBE_RANGES = ((0, 1), (1, 2), (0, 6))  # tiny GPT: embedding (few big tensors), one block, the whole


WAKE_SLEEP_S = 0.004  # about one tiny action: long enough for the core to go idle
CPU_ROUNDS = 30  # turns of every CPU-time probe: this host's speed flips between two modes every ~0.2-0.5 s


@dataclass(frozen=True, slots=True)
class CpuTerms:
    """What the thread-CPU-time probes measured (seconds): dispatch per block (1 sample x 1 token), the
    reference stage's F+B, and (tensors, parameters, step seconds) per optimizer probe (OPTIM_PROBE_RANGES'
    stage modules, then the whole model's 1-D parameters)."""

    fwd_layer_s: float
    bwd_layer_s: float
    edge_fwd_s: float
    edge_bwd_s: float
    wake_s: float
    reference_fb_s: float
    optimizer: tuple[tuple[int, float, float], ...]


def _cpu_terms(rounds: int = CPU_ROUNDS) -> CpuTerms:
    """Every thread-CPU-time probe in turns, `rounds` times, each term the mean over rounds of its in-round
    median. Why: this VM's CPU speed is bimodal (~1.45x, flipping every fraction of a second); one probe
    timed in a block can land wholly in one mode and the next in the other, so terms measured in blocks
    disagree by up to that factor (compute_scale varied 3x between calibrations). In turns, every term sees
    the same mix of modes, the mix a training run averages over.

    The probes: forward / backward of the executor's stage modules with 1 and 3 blocks at 1 sample x 1
    token (their slope is the per-block dispatch; the 1-block intercept is the action's own call overhead)
    and of the embedding and the head alone (their mean: the per-edge-slot cost, intercept included), a
    two-block action back to back and with a sleep before its forward and its backward (half the difference:
    the wake-up cost per action),
    the reference stage's F+B (reference_plan()'s stage, behind compute_scale), and the executor's optimizer
    step (make_optimizer: single-tensor AdamW, then zero_grad) over the stage modules of OPTIM_PROBE_RANGES
    and over the whole model's 1-D parameters."""
    import torch

    torch.set_num_threads(1)
    probes = _cpu_probes()
    _warm_up(probes)
    mean = _probe_rounds(probes, rounds)
    optimizer = tuple((len(params), float(sum(p.numel() for p in params)), mean[f"opt{i}"])
                      for i, params in enumerate(probes.opt_sets))
    return CpuTerms(per_block_slope(mean["f1"], mean["f3"]), per_block_slope(mean["b1"], mean["b3"]),
                    (mean["edge_f0"] + mean["edge_f1"]) / 2, (mean["edge_b0"] + mean["edge_b1"]) / 2,
                    max(0.0, mean["woken"] - mean["awake"]) / 2, mean["ref"], optimizer)


_clock = time.thread_time  # the probes' clock: the work, not other processes' load


@dataclass(frozen=True, slots=True)
class _CpuProbes:
    """What `_cpu_terms` times (stage modules with their inputs): the reference stage, 1- and 3-block stages
    (`dispatch`), the embedding and the head alone (`edges`), a typical two-block `action`, and optimizer
    parameter sets with their optimizers."""

    ref: Any
    ref_x: Any
    dispatch: list[tuple[Any, Any]]
    edges: list[tuple[Any, Any]]
    action: tuple[Any, Any]
    opt_sets: list[list[Any]]
    opts: list[Any]


def _cpu_probes() -> _CpuProbes:
    """Build the probes on tiny-gpt's executor stage modules (hetauto.runtime.stage.build_stage)."""
    import torch

    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    cfg = get_model("tiny-gpt")
    ref, ref_x = _reference_stage()
    n = cfg.num_layers + 2
    dispatch = [(build_stage(cfg, (1, 1 + blocks), 0), torch.randn(1, 1, cfg.hidden, requires_grad=True))
                for blocks in (1, 3)]
    # the edges alone: the embedding (token ids in) and the head (hidden states in, loss-like sum out)
    edges = [(build_stage(cfg, (0, 1), 0), torch.zeros(1, 1, dtype=torch.long)),
             (build_stage(cfg, (n - 1, n), 0), torch.randn(1, 1, cfg.hidden, requires_grad=True))]
    # a typical action (two blocks, a 2 x 32 microbatch), back to back and after a sleep
    action = (build_stage(cfg, (1, 3), 0), torch.randn(2, 32, cfg.hidden, requires_grad=True))
    opt_sets = [list(build_stage(cfg, layers, 0).parameters()) for layers in OPTIM_PROBE_RANGES]
    # and the whole model's vectors (biases, norms): many tensors, few parameters, pinning the per-tensor term
    opt_sets.append([p for p in build_stage(cfg, (0, n), 0).parameters() if p.dim() == 1])
    opts = [make_optimizer(params, 1e-3) for params in opt_sets]
    return _CpuProbes(ref, ref_x, dispatch, edges, action, opt_sets, opts)


def _ref_fb(probes: _CpuProbes) -> float:
    """The reference stage's forward + backward."""
    t = _clock()
    probes.ref(probes.ref_x).float().sum().backward()
    return _clock() - t


def _fwd_bwd(st: Any, x: Any) -> tuple[float, float]:
    """(forward, backward) of one stage module on `x`."""
    t = _clock()
    y = st(x)
    t1 = _clock()
    y.float().sum().backward()
    return t1 - t, _clock() - t1


def _woken_fb(action: tuple[Any, Any]) -> float:
    """The action's forward + backward, each after a sleep (what a rank waiting on a receive pays)."""
    time.sleep(WAKE_SLEEP_S)
    f = _clock()
    y = action[0](action[1])
    f = _clock() - f
    time.sleep(WAKE_SLEEP_S)
    b = _clock()
    y.float().sum().backward()
    return f + _clock() - b


def _opt_step(params: list[Any], opt: Any) -> float:
    """One optimizer step (and zero_grad) over `params`."""
    import torch

    return _timed_optimizer_step(params, opt, torch.randn_like)


def _warm_up(probes: _CpuProbes) -> None:
    """Every probe once (the optimizers three times: the first steps allocate the moments)."""
    _ref_fb(probes)
    for st, x in probes.dispatch + probes.edges + [probes.action]:
        _fwd_bwd(st, x)
    for _ in range(3):  # the first steps allocate the moments
        for params, opt in zip(probes.opt_sets, probes.opts):
            _opt_step(params, opt)


def _probe_rounds(probes: _CpuProbes, rounds: int) -> dict[str, float]:
    """Every probe in turns, `rounds` times: per term the mean over rounds of its in-round median."""
    per_round: dict[str, list[float]] = {}

    def add(name: str, samples: list[float]) -> None:
        per_round.setdefault(name, []).append(statistics.median(samples))

    for _ in range(rounds):
        add("ref", [_ref_fb(probes) for _ in range(3)])
        for blocks, (st, x) in zip((1, 3), probes.dispatch):
            fb = [_fwd_bwd(st, x) for _ in range(5)]
            add(f"f{blocks}", [f for f, _ in fb])
            add(f"b{blocks}", [b for _, b in fb])
        for i, (st, x) in enumerate(probes.edges):
            fb = [_fwd_bwd(st, x) for _ in range(5)]
            add(f"edge_f{i}", [f for f, _ in fb])
            add(f"edge_b{i}", [b for _, b in fb])
        for i, (params, opt) in enumerate(zip(probes.opt_sets, probes.opts)):
            add(f"opt{i}", [_opt_step(params, opt) for _ in range(2)])
        add("awake", [sum(_fwd_bwd(*probes.action)) for _ in range(2)])
        add("woken", [_woken_fb(probes.action) for _ in range(2)])
    return {k: statistics.fmean(v) for k, v in per_round.items()}


def _quantile(values: list[float], q: float) -> float:
    ts = sorted(values)
    return ts[min(len(ts) - 1, int(q * len(ts)))]


def _core_share(rank: int, world: int, repeat: int) -> float:
    """CPU / wall time of the reference stage's F+B loop in this rank: the share of a core it got."""
    st, x = _reference_stage()
    st(x).float().sum().backward()  # warm-up
    w, c = time.perf_counter(), time.thread_time()
    for _ in range(repeat):
        st(x).float().sum().backward()
    wall = time.perf_counter() - w
    return (time.thread_time() - c) / wall if wall > 0 else 1.0


def available_cores(repeat: int = 10) -> float:
    """Cores this machine gives its ranks *now*: one copy of the reference stage per core, each measuring the
    share of a core it got (CPU / wall); their sum. Why: on a shared machine other processes take cores, and
    the Evaluator's host-core contention (Overheads.host_cores) should see what is left at run time."""
    from hetauto.launch.rank_pool import run_ranks

    cores = os.cpu_count() or 1
    shares = run_ranks(_core_share, cores, repeat, timeout=120)
    return max(0.1, min(float(cores), sum(shares)))


def _reference_stage() -> tuple[Any, Any]:
    """reference_plan()'s stage module (the whole tiny GPT, one thread) and its microbatch of 8 x 32 tokens."""
    import torch

    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.stage import build_stage

    torch.set_num_threads(1)
    return build_stage(get_model("tiny-gpt"), (0, 6), 0), torch.randint(0, 256, (8, 32))


LEVEL_RUNS = 3  # executor runs of reference_pipeline() behind the CPU terms' level (their median)


def _reference_plan_terms(profile: DeviceProfile, oh: Overheads, device_key: str, isolated_fb: float) -> Overheads:
    """compute_scale from the reference stage's F+B timed in isolation (`isolated_fb`); then the CPU terms'
    level from the executor's own run of reference_pipeline(), and step_s from its run of reference_plan()
    (`hetauto run`, per-action CPU and wall time).

    Why the executor: it does the same F/B with more around it (two ranks computing at once, waits between
    actions, the loss, its buffers and hooks) and its actions take ~1.2-1.3x the CPU time the isolated
    probes predict. Every CPU-time term is scaled by that ratio (Overheads.at_speed): the isolated probes
    give the terms' *shape* (per block, per edge, per tensor, per microbatch size), the executor their level.
    The run is repeated LEVEL_RUNS times and the median ratio kept (a speed probe next to each run did not
    track the run's own speed on this VM: it added noise, not removed it). The same run's link emulation says how
    late it delivers (link_lag_s). step_s is the one-rank run's step
    minus its F, B and OPTIM wall time (loss, data, bookkeeping), measured against the run's own actions so
    the host's speed at that moment cancels out."""
    from hetauto.planner.evaluate import Evaluator, inputs_for_plan

    ref = reference_plan()
    st = ref.stages[0]
    ev = Evaluator(inputs_for_plan(ref), profile_overrides={device_key: profile}, overheads=oh)
    d = ev.stage_detail(st.cluster, st.layers, 1, 1, ref.microbatch_size)
    oh = replace(oh, compute_scale=compute_scale_for(isolated_fb, d.fwd_compute_s + d.bwd_compute_s,
                                                     sum(ev.dispatch_s(st.layers, 1.0))), reference_fb_s=isolated_fb)
    ratios, lags = _pipeline_level(profile, oh, device_key, LEVEL_RUNS)
    if ratios:
        oh = oh.at_speed(statistics.median(ratios))
    if lags:
        oh = replace(oh, link_lag_s=statistics.median(lags))
    doc = _executor_run(ref, 12, emulate=False)
    if doc is not None:
        oh = replace(oh, step_s=step_residual(doc["measured_step_s"],
                                              (doc.get("stage_compute") or [{}])[0].get("wall_s", {})))
    return oh


def _pipeline_level(profile: DeviceProfile, oh: Overheads, device_key: str,
                    runs: int) -> tuple[list[float], list[float]]:
    """`runs` executor runs of reference_pipeline(): per run, its F and B actions' measured CPU time over what
    `oh` predicts for them, and the link emulation's mean dispatch lag."""
    from hetauto.planner.evaluate import Evaluator, inputs_for_plan

    plan = reference_pipeline()
    ev = Evaluator(inputs_for_plan(plan), profile_overrides={device_key: profile}, overheads=oh)
    costs = ev.pipeline_costs(plan)
    m = plan.num_microbatches
    speed = [ev.cluster(s.cluster).speed_factor for s in plan.stages]  # CPU time: the throttle's sleep apart
    ratios, lags = [], []
    for _ in range(runs):  # one run can land in a slow or a fast spell of the host: the median of a few
        doc = _executor_run(plan, 20, emulate=True)
        if doc is not None:
            stages = doc.get("stage_compute", [])
            measured = sum(c["cpu_s"].get("F", 0.0) + c["cpu_s"].get("B", 0.0) for c in stages)
            predicted = sum(m * (costs.tf[c["stage"]] + costs.tb[c["stage"]]) * speed[c["stage"]] for c in stages)
            if measured > 0 and predicted > 0:
                ratios.append(measured / predicted)
            lags.append(float((doc.get("link_dispatch_lag") or {}).get("mean_s", 0.0)))
    return ratios, lags


def host_level(cal: Calibration, runs: int = 1) -> float:
    """How much longer (> 1) or shorter the executor's CPU work takes now than `cal` predicts: the median over
    `runs` runs of reference_pipeline() (~5 s each) of measured / predicted F+B CPU time; 1.0 if none ran.

    Why: a shared host's speed drifts (on this VM ~25% over ten minutes, while a calibration takes a few), so a
    prediction made minutes after its calibration inherits that drift. `cal.at_level(host_level(cal))` is the
    calibration re-levelled to the host as it is now; only the level is re-measured, every term's shape stays."""
    ratios, _ = _pipeline_level(cal.profile, cal.overheads, cal.device_key, runs)
    return statistics.median(ratios) if ratios else 1.0


def _executor_run(plan: Any, steps: int, *, emulate: bool) -> dict[str, Any] | None:
    """`hetauto run PLAN --json` (no reference loss) in a subprocess; its JSON document, None if it failed."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        plan.save(path)
        out = subprocess.run([sys.executable, "-m", "hetauto.cli", "run", str(path), "--json", "--steps", str(steps),
                              "--no-reference"] + (["--emulate"] if emulate else []),
                             capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _best_profile(device_key: str, tries: int = 2) -> DeviceProfile:
    """The quick float32 profile, measured `tries` times; the fastest at the reference stage's GEMM size wins
    (on a shared machine a descheduled run only ever looks slower, so the fastest is the least disturbed)."""
    from hetauto.backends import get_backend
    from hetauto.profiling.runner import ProfileOptions, run_profile

    best: DeviceProfile | None = None
    gemm = 2.0 * 256**3
    floor = 0.5 * _cpu_time_gemm_flops(256)
    for i in range(tries + 3):
        run = run_profile(get_backend(device_key), ProfileOptions(quick=True, dtypes=("float32",), collectives=False,
                                                                  repeats=7, progress=False))
        prof = run.profile if hasattr(run, "profile") else run
        if best is None or prof.achieved_flops(gemm, 1) > best.achieved_flops(gemm, 1):
            best = prof
        # enough tries, and the best agrees (within 2x) with a 256^3 GEMM in CPU time: not disturbed
        if i + 1 >= tries and best.achieved_flops(gemm, 1) >= floor:
            break
    assert best is not None
    return best


def _cpu_time_gemm_flops(n: int, repeat: int = 20) -> float:
    """FLOP/s of an n^3 float32 GEMM in thread CPU time (one thread): what the wall-clock profile should
    roughly reach when nothing else is running."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_median_time(lambda: a @ b, 1, time.thread_time) for _ in range(repeat))
    return 2.0 * n**3 / best if best > 0 else 0.0


def _companion_loop(limit_s: float = 900.0) -> None:
    """A busy companion (`busy_host`): the reference stage's F+B in a loop until killed, its parent exits, or
    `limit_s` passes (never an orphan that outlives the calibration)."""
    import sys

    parent = os.getppid()
    st, x = _reference_stage()
    st(x).float().sum().backward()
    print("ready", flush=True)
    sys.stdout.close()
    end = time.monotonic() + limit_s
    while time.monotonic() < end and os.getppid() == parent:
        st(x).float().sum().backward()


class busy_host:
    """Keep `n` other cores busy with the reference stage's F+B while the CPU-time probes run.

    Why: this host's cores slow each other down when they all compute (shared caches and memory bandwidth, and
    on this VM a bimodal clock: one busy core often runs ~1.45x faster than two), and a multi-rank run keeps
    every core busy. Probed with the other cores idle, the compute terms would come out at whichever speed the
    host happened to give a lone core; with them busy they come out at the speed the ranks get."""

    def __init__(self, n: int) -> None:
        self.n = max(0, n)
        self.procs: list[Any] = []

    def __enter__(self) -> "busy_host":
        import subprocess
        import sys

        code = "from hetauto.profiling.calibration import _companion_loop; _companion_loop()"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
                      for _ in range(self.n)]
        for p in self.procs:
            p.stdout.readline()  # "ready" (or EOF if it failed: then it simply adds no load)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


CALIBRATION_PHASES = ("gloo latency and all-reduce bandwidth, alone and beside busy cores",
                      "DTensor per block, alone", "DTensor per block, beside busy cores",
                      "GEMM profile and CPU-time probes", "executor runs of the reference pipeline")


def measure_calibration(device_key: str = "cpu", progress: Any = None) -> Calibration:
    """Measure this machine (CPU backend): quick float32 profile, layer dispatch costs, gloo alphas.
    `progress(i, phase)` (optional) is called as each of CALIBRATION_PHASES starts (~75 s in all here)."""
    import datetime

    from hetauto.launch.rank_pool import run_ranks

    def phase(i: int) -> None:
        if progress is not None:
            progress(i, CALIBRATION_PHASES[i])

    cores = os.cpu_count() or 1
    phase(0)
    alphas = run_ranks(_comm_alphas, 2, 200, timeout=120)
    p2p = statistics.fmean(a[0] for a in alphas)
    ar = statistics.fmean(a[1] for a in alphas)
    ar_big = statistics.fmean(a[2] for a in alphas)
    ar_after = statistics.fmean(a[3] for a in alphas)
    with busy_host(cores):  # the all-reduce after compute again, with every core's worth of other work beside it
        ar_after_loaded = statistics.fmean(a[3] for a in run_ranks(_comm_alphas, 2, 200, timeout=120))
    phase(1)
    tp = run_ranks(_tp_block_overheads, 2, 20, timeout=300)
    phase(2)
    with busy_host(cores):  # the same TP pair with every core's worth of other work beside it
        tp_loaded = run_ranks(_tp_block_overheads, 2, 20, timeout=300)
    phase(3)
    with busy_host(cores - 1):  # CPU-time probes at the speed a rank gets while the other ranks compute
        profile = _best_profile(device_key)
        cpu = _cpu_terms()
    # DTensor per block in wall time (its dispatch and the waits on its collectives: what an action lasts)
    tpf, tpb = (statistics.fmean(t[i] for t in tp) for i in (0, 1))
    tpf_cpu, tpb_cpu = (statistics.fmean(t[i] for t in tp) for i in (2, 3))
    tp_optim = statistics.fmean(t[4] for t in tp)
    optim_tensor, optim_param = optimizer_fit(list(cpu.optimizer))
    oh = Overheads(fwd_layer_s=cpu.fwd_layer_s, bwd_layer_s=cpu.bwd_layer_s, edge_fwd_s=cpu.edge_fwd_s,
                   edge_bwd_s=cpu.edge_bwd_s, wake_s=cpu.wake_s, p2p_alpha_s=p2p, allreduce_alpha_s=ar, step_s=0.0,
                   tp_fwd_layer_s=tpf, tp_bwd_layer_s=tpb,
                   tp_fwd_layer_loaded_s=max(tpf, statistics.fmean(t[0] for t in tp_loaded)),
                   tp_bwd_layer_loaded_s=max(tpb, statistics.fmean(t[1] for t in tp_loaded)),
                   tp_cpu_fraction=tp_cpu_fraction(tpf + tpb, tpf_cpu + tpb_cpu),
                   allreduce_Bps=allreduce_bandwidth(AR_PROBE_BYTES, ar, ar_big),
                   allreduce_wake_s=max(0.0, ar_after - ar_big),
                   allreduce_wake_loaded_s=max(0.0, ar_after - ar_big, ar_after_loaded - ar_big),
                   optim_tensor_s=optim_tensor, optim_param_s=optim_param, tp_optim_block_s=tp_optim)
    # the CPU terms' level and step_s from the executor's own run (its two ranks keep both cores busy)
    phase(4)
    oh = _reference_plan_terms(profile, oh, device_key, cpu.reference_fb_s)
    # what computing side by side costs the hardware is in the terms above (measured with every core busy):
    # host_cores is left to time-slicing, which the Evaluator models when ranks outnumber the cores
    oh = replace(oh, host_cores=float(cores))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return Calibration(device_key, profile, oh, platform.node(), torch_version(), now)
