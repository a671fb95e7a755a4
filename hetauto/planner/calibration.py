"""Local calibration: what this machine's executor costs beyond the analytical model, measured once and cached.

Why: the catalog `cpu` profile is a guess, and on a CPU a tiny model's step is dominated by fixed costs the
FLOP model does not see (eager dispatch per layer, gloo message latency). `hetauto run` compares its measured
step with the prediction, so the prediction for *this* machine must use measured numbers:

- `profile`: a quick `hetauto.profiling.run_profile` (GEMM efficiency fit, memory bandwidth, float32: the
  executor's CPU dtype) that replaces the catalog entry for the local device key;
- `Overheads`: dispatch cost of one forward / one backward per transformer block and per embedding/head slot
  (the executor's own stage modules at a negligible shape: 1 sample x 1 token), the wake-up cost of an action
  after its rank slept, per-message point-to-point alpha and all-reduce alpha (two gloo processes, tiny
  tensors); the bytes per activation and gradient element are each plan's precision's (fp32 on CPU), not
  measured here;
- what a CPU host adds for tp/dp > 1: DTensor's per-block cost at tp = 2 (two processes, sharded vs plain
  stage), the gloo all-reduce bus bandwidth (1 MiB vs a tiny all-reduce), and the host's cores (for
  time-slicing when ranks outnumber them).

How the CPU-time terms (dispatch, the reference F+B behind compute_scale, the optimizer step, wake-up) are
taken: thread CPU time (the work itself, which other engineers' load does not inflate), every probe in turns
over many rounds (`_cpu_terms`: this VM's speed flips between two modes several times a second, so terms
timed in blocks disagreed by up to 3x), with companion processes keeping the other cores busy (`busy_host`:
a multi-rank run's condition; this host's cores slow each other when all compute); then their *level* is
set by the executor itself: its run of `reference_pipeline()` reports per-action CPU time, and every CPU term
is scaled by measured / predicted (~1.2-1.3x: the loss, hooks, buffers and waits around an action). The gloo
terms are wall-clock low quantiles; DTensor's per-block term is a wall-clock median (a TP action lasts its
dispatch *plus* the waits on its many small collectives), with its CPU share kept apart (`tp_cpu_fraction`,
process CPU time: gloo's threads included) so host-core contention counts only the work, and measured again
with every core's worth of other work beside it (`tp_*_layer_loaded_s`: its waits grow with the load); the
DP all-reduce gets its wake-up cost right after compute (`allreduce_wake_s`: the executor's REDUCE_GRAD
follows the last backward, not a tight loop; again beside busy cores, `allreduce_wake_loaded_s`); the quick
GEMM profile is taken twice and the faster kept (a descheduled run only ever looks slower).

The planner holds only the values: `Overheads`, `Calibration`, the cache file and the pure fits the
Evaluator reads; the probes that measure them (they run the profiler, the runtime and executor runs) live in
`hetauto.profiling.calibration` (the planner never touches a device). Nothing is measured unless asked:
`hetauto calibrate` (or `hetauto.profiling.calibration.ensure_calibration()`) measures and writes
`~/.cache/hetauto/calibration-<host>-torch<version>.json` (plain JSON, no pickle); `local_calibration()` only
reads that file (None when absent), so tests and the planner stay deterministic. The Evaluator takes the
result as `Evaluator(inputs, profile_overrides=cal.profile_overrides(), overheads=cal.overheads)`.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from hetauto.core.profile import DeviceProfile

__all__ = ["Calibration", "Overheads", "allreduce_bandwidth", "cache_path", "compute_scale_for", "is_stale",
           "local_calibration", "optimizer_fit", "per_block_slope", "reference_pipeline", "reference_plan",
           "save_calibration", "step_residual", "torch_version", "tp_cpu_fraction"]

CALIBRATION_SCHEMA = "hetauto.calibration/1"


@dataclass(frozen=True, slots=True)
class Overheads:
    """Fixed costs of the executor that scale with actions, layers and messages, not with FLOPs (seconds).

    `fwd_layer_s`/`bwd_layer_s` are per transformer block of a stage per microbatch action (divided by the
    cluster's speed factor, like compute: the executor throttles the whole action), `edge_fwd_s`/`edge_bwd_s`
    the same per embedding or head slot; `p2p_alpha_s` is added to every
    boundary message's latency; `allreduce_alpha_s` to every data-parallel gradient all-reduce;
    `step_s` once per iteration; `allreduce_wake_s` to every DP all-reduce too (measured as it runs in a step:
    right after compute, where rank skew and waking gloo's threads cost more than a tight loop's alpha);
    `activation_bytes_scale` and `grad_bytes_scale` are read from older caches (which set 2.0: the executor
    sends fp32 on CPU) but no longer applied: the Evaluator prices each plan's own precision (fp32 on the cpu
    and mock backends), which is what they stood in for.

    Terms for what one CPU host adds (all neutral by default, so the analytical model stays the GPU one):
    `tp_fwd_layer_s`/`tp_bwd_layer_s` per transformer block of a tp > 1 stage per action (DTensor's
    per-op sharding dispatch and its small gloo collectives: ~10 ms per block on a CPU, dwarfing the
    FLOPs; like compute, divided by the speed factor); `allreduce_Bps` the measured gloo all-reduce bus
    bandwidth (with `allreduce_alpha_s` as the ring's 2 latency steps at d = 2) replacing the DP group's
    link; `host_cores` the cores all ranks share
    (time-slicing when they outnumber them; the slowdown of cores computing side by side is already in the
    CPU-time terms, measured with every core busy); `tp_cpu_fraction`
    the CPU share of the (wall-clock) TP terms, so host-core contention counts only the work, not the waits."""

    fwd_layer_s: float = 0.0
    bwd_layer_s: float = 0.0
    p2p_alpha_s: float = 0.0
    allreduce_alpha_s: float = 0.0
    step_s: float = 0.0
    activation_bytes_scale: float = 1.0  # superseded by the plan's precision: read, not applied
    compute_scale: float = 1.0  # reference stage: (measured F+B - its dispatch terms) / analytical F+B
    host_cores: float = 0.0  # > 0: all ranks share this many cores (one-machine emulation); 0: own devices
    tp_fwd_layer_s: float = 0.0  # per transformer block of a tp > 1 stage per forward action (DTensor dispatch)
    tp_bwd_layer_s: float = 0.0  # ... per backward action
    allreduce_Bps: float = 0.0  # > 0: measured all-reduce bus bandwidth replacing the DP group's link
    grad_bytes_scale: float = 1.0  # superseded by the plan's grad_reduce_dtype: read, not applied
    reference_fb_s: float = 0.0  # > 0: measured F+B of reference_plan()'s stage, anchoring a covering forest
    tp_cpu_fraction: float = 1.0  # share of tp_*_layer_s that is CPU work (the rest: collective waits, no core)
    allreduce_wake_s: float = 0.0  # extra wall time of a DP all-reduce issued right after compute (rank skew,
    #                                gloo threads waking) over the same all-reduce in a tight loop
    optim_tensor_s: float = 0.0  # > 0 (or optim_param_s > 0): the optimizer step per parameter tensor of a stage
    optim_param_s: float = 0.0  # ... plus per parameter of one device, replacing memory-bound Adam
    tp_optim_block_s: float = 0.0  # extra optimizer step per transformer block of a tp > 1 stage (DTensor)
    # per embedding / head slot per action (a lookup or one projection: a few ops, ~1/3 of a block's); both 0:
    # not measured, such a slot costs what a block does (fwd_layer_s / bwd_layer_s)
    edge_fwd_s: float = 0.0
    edge_bwd_s: float = 0.0
    # extra CPU time of an F/B action that starts after its rank slept (a receive's wait, a throttle's sleep):
    # the core's caches and clock have gone cold (~0.5 ms per action here, a fifth of a tiny stage's action)
    wake_s: float = 0.0
    # added to every cross-cluster boundary message: how late the link emulation posts a send after its delivery
    # time (its thread needs the GIL and a core; ~0.4-1.3 ms here), on top of the gloo exchange (p2p_alpha_s)
    link_lag_s: float = 0.0
    # tp_fwd_layer_s / tp_bwd_layer_s measured with host_cores companion processes computing beside the TP pair
    # (0: not measured). Why: a TP action is dozens of small collectives, and each one waits for a partner that
    # time-slicing may have put off its core, so its waits grow with the host's load far beyond its own work's
    # stretch (~1.5x per block with every core's worth of other work here); the Evaluator interpolates between
    # the two by the load the plan's other ranks put on the host
    tp_fwd_layer_loaded_s: float = 0.0
    tp_bwd_layer_loaded_s: float = 0.0
    # allreduce_wake_s measured the same way, beside host_cores companions (0: not measured): a REDUCE_GRAD
    # issued right after compute waits longer for a partner that is off its core (~+3 ms here)
    allreduce_wake_loaded_s: float = 0.0

    def at_speed(self, ratio: float) -> "Overheads":
        """These overheads for CPU work that takes `ratio` times as long as where they were measured (the
        executor vs isolated probes, a host running slower): every CPU-time term (dispatch, compute_scale,
        DTensor, optimizer, per-step work, wake-up, the reference F+B) times `ratio`; the gloo terms (wall-clock
        exchanges, mostly waiting) and host_cores as they are."""
        cpu = ("fwd_layer_s", "bwd_layer_s", "edge_fwd_s", "edge_bwd_s", "compute_scale", "tp_fwd_layer_s",
               "tp_bwd_layer_s", "optim_tensor_s", "optim_param_s", "tp_optim_block_s", "step_s", "reference_fb_s",
               "wake_s", "tp_fwd_layer_loaded_s", "tp_bwd_layer_loaded_s")
        return replace(self, **{name: getattr(self, name) * ratio for name in cpu})

    def dispatch_s(self, blocks: float, edges: float) -> tuple[float, float]:
        """(forward, backward) fixed cost of an action over `blocks` transformer blocks and `edges`
        embedding/head slots (already divided by the speed factor when the caller throttles)."""
        if self.edge_fwd_s > 0 or self.edge_bwd_s > 0:
            return (blocks * self.fwd_layer_s + edges * self.edge_fwd_s,
                    blocks * self.bwd_layer_s + edges * self.edge_bwd_s)
        return ((blocks + edges) * self.fwd_layer_s, (blocks + edges) * self.bwd_layer_s)


@dataclass(frozen=True, slots=True)
class Calibration:
    device_key: str
    profile: DeviceProfile
    overheads: Overheads
    host: str
    torch_version: str
    measured_at: str
    # Overheads terms the file predates (read as neutral): the prediction is weaker until re-measured
    missing_terms: tuple[str, ...] = ()

    def profile_overrides(self) -> dict[str, DeviceProfile]:
        return {self.device_key: self.profile}

    def at_level(self, ratio: float) -> "Calibration":
        """This calibration for a host whose CPU work now takes `ratio` times as long (`host_level`)."""
        return replace(self, overheads=self.overheads.at_speed(ratio))

    def to_document(self) -> dict[str, Any]:
        return {"schema": CALIBRATION_SCHEMA, "device_key": self.device_key, "profile": self.profile.to_document(),
                "overheads": asdict(self.overheads), "host": self.host, "torch_version": self.torch_version,
                "measured_at": self.measured_at}

    @classmethod
    def from_document(cls, doc: dict[str, Any], source: str | Path) -> "Calibration":
        from hetauto.core.errors import SpecError
        from hetauto.core.profile import profile_from_dict

        if doc.get("schema") != CALIBRATION_SCHEMA:
            raise SpecError(source, "schema", f"expected {CALIBRATION_SCHEMA!r}, got {doc.get('schema')!r}",
                            "delete the file and re-measure with `hetauto calibrate`")
        try:
            oh = Overheads(**{k: float(v) for k, v in doc["overheads"].items()})
            missing = tuple(f.name for f in fields(Overheads) if f.name not in doc["overheads"])
            return cls(str(doc["device_key"]), profile_from_dict(doc["profile"], source), oh, str(doc["host"]),
                       str(doc["torch_version"]), str(doc["measured_at"]), missing)
        except (KeyError, TypeError, ValueError) as err:
            raise SpecError(source, "overheads", f"malformed calibration ({err})", "delete the file and re-measure") from None


def torch_version() -> str:
    from importlib.metadata import version

    try:
        return version("torch")
    except Exception:  # noqa: BLE001 - torch metadata missing: still key the cache
        return "unknown"


def cache_path(cache_dir: str | Path | None = None) -> Path:
    """Cache file for this host and torch version (`HETAUTO_CACHE_DIR` or ~/.cache/hetauto)."""
    root = Path(cache_dir or os.environ.get("HETAUTO_CACHE_DIR") or Path.home() / ".cache" / "hetauto")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{platform.node()}-torch{torch_version()}")
    return root / f"calibration-{safe}.json"


def local_calibration(*, cache_dir: str | Path | None = None) -> Calibration | None:
    """The cached calibration of this machine, None when absent (reads only; `hetauto calibrate` or
    `hetauto.profiling.calibration.ensure_calibration` measures)."""
    path = cache_path(cache_dir)
    if not path.is_file():
        return None
    return Calibration.from_document(read_calibration_document(path), path)


def read_calibration_document(path: Path) -> dict[str, Any]:
    """The cache file's JSON document; a SpecError naming the file and the fix when it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        from hetauto.core.errors import SpecError

        raise SpecError(path, "", f"not a readable calibration ({err})",
                        "delete the file and re-measure with `hetauto calibrate`") from None


def save_calibration(cal: Calibration, cache_dir: str | Path | None = None) -> Path:
    """Write `cal` where `local_calibration` reads it (plain JSON); returns the path."""
    path = cache_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal.to_document(), indent=1))
    return path


def is_stale(doc: dict[str, Any]) -> bool:
    """A file written before some Overheads term existed: it reads (missing terms neutral), but asking to
    measure re-measures it."""
    have = doc.get("overheads", {})
    return any(f.name not in have for f in fields(Overheads))


# ------------------------------------------ pure fits and the reference plans (probes: hetauto.profiling)
def allreduce_bandwidth(nbytes: float, small_s: float, big_s: float) -> float:
    """Bus bandwidth of a 2-rank ring all-reduce from a tiny and an `nbytes` one (2(d-1)/d = 1 at d = 2):
    nbytes / (big - small); 0.0 (use the link) when the difference is not positive (noise)."""
    return nbytes / (big_s - small_s) if big_s > small_s else 0.0


def compute_scale_for(measured_fb_s: float, analytical_fb_s: float, dispatch_s: float) -> float:
    """Scale of the analytical (FLOP and byte) part so the reference stage's F+B comes out as measured:
    (measured - the stage's dispatch terms) / analytical. The dispatch terms are measured on their own and
    stay unscaled; at least 5% of measured is left to the FLOPs (a noisy dispatch measurement)."""
    rest = max(measured_fb_s - dispatch_s, 0.05 * measured_fb_s)
    return rest / analytical_fb_s if analytical_fb_s > 0 else 1.0


def per_block_slope(t1: float, t3: float) -> float:
    """Per-block cost from 1- and 3-block timings: (t3 - t1) / 2, at least t1 / 2 when noise makes the
    slope smaller (the 1-block time is one block plus the action's fixed part)."""
    return max((t3 - t1) / 2, t1 / 2)


def optimizer_fit(samples: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(per tensor, per parameter) seconds from (tensors, parameters, step seconds) samples: least squares
    through the origin on *relative* errors (each sample divided by its time, so a 7 ms step does not drown a
    0.3 ms one that pins the per-tensor term), both non-negative (a negative slope from noise is dropped and
    the other refitted)."""
    samples = [(n / y, p / y, 1.0) if y > 0 else (n, p, y) for n, p, y in samples]
    stt = sum(n * n for n, _, _ in samples)
    spp = sum(p * p for _, p, _ in samples)
    stp = sum(n * p for n, p, _ in samples)
    sty = sum(n * y for n, _, y in samples)
    spy = sum(p * y for _, p, y in samples)
    det = stt * spp - stp * stp
    if det > 0:
        a = (sty * spp - spy * stp) / det
        b = (spy * stt - sty * stp) / det
        if a >= 0 and b >= 0:
            return a, b
    a1 = sty / stt if stt > 0 else 0.0
    b1 = spy / spp if spp > 0 else 0.0
    # one term alone: the one with the smaller squared error
    err_a = sum((y - a1 * n) ** 2 for n, _, y in samples)
    err_b = sum((y - b1 * p) ** 2 for _, p, y in samples)
    return (max(0.0, a1), 0.0) if err_a <= err_b else (0.0, max(0.0, b1))


def tp_cpu_fraction(wall_s: float, cpu_s: float) -> float:
    """CPU share of the wall-clock TP terms, in [0, 1] (1.0 when the wall time is not positive)."""
    return min(1.0, max(0.0, cpu_s / wall_s)) if wall_s > 0 else 1.0


def reference_plan():  # noqa: ANN201 - a Plan
    """The calibration's reference run: the whole tiny GPT as one stage on one cpu-demo device, one microbatch
    of 8. Not one of the plans `benchmarks/predicted_vs_measured.py` validates on."""
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan

    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=8,
                num_microbatches=1, schedule=ScheduleSpec(name="1f1b"),
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1),))


def reference_pipeline():  # noqa: ANN201 - a Plan
    """The calibration's executor run (emulated, as `hetauto run --emulate` runs cpu-demo plans): the tiny GPT
    cut after its first block, the embedding and that block on a `fast` device, the rest on a `slow` one
    (throttled), two microbatches of 4 over the emulated 1 ms link: two ranks computing at once, waiting on
    each other and on the link, as the executor runs a pipeline. Not one of the plans
    `benchmarks/predicted_vs_measured.py` validates on."""
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan

    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=4,
                num_microbatches=2, schedule=ScheduleSpec(name="1f1b"),
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 2), tp=1, dp=1),
                        StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(2, 6), tp=1, dp=1)))


def step_residual(step_s: float, action_wall_s: dict[str, float]) -> float:
    """A one-stage run's per-step cost outside its actions: the step minus its F, B and OPTIM wall time
    (`hetauto.job.results.StageCompute.wall_s`), never negative."""
    return max(0.0, step_s - sum(action_wall_s.values()))


