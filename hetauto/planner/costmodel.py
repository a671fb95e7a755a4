"""Analytical per-stage costs: compute, tensor-parallel collectives, data-parallel reduction, optimizer step,
memory per device and pipeline-boundary transfers. Pure arithmetic on `PlanningInputs`; no torch.

Why a closed form first: the planner scores hundreds of thousands of candidates, so every stage cost must be
O(1). Layer sums come from prefix sums over the layer list; efficiency depends only on the GEMM size, so a
stage of any length costs a handful of multiplications. The learned correction (`correction.py`) multiplies
the compute part by a measured/analytical ratio; the closed forms here stay the explainable baseline.

Conventions (SI units). Precision (`hetauto.core.precision`, resolved per plan by the Evaluator): activations,
stage-boundary tensors and TP collectives are in the compute dtype (2 bytes for bf16/fp16, 4 for fp32; the
LayerTable is built at that size). Model states follow what torch.autocast does, which is how the executor runs
mixed precision: the parameters stay fp32 (autocast casts per op and keeps no persistent 16-bit copy), their
gradients are fp32, AdamW keeps m and v in fp32: 4 + 4 + 8 = 16 bytes per parameter at every precision (pure
fp32 is the same 16). ZeRO-1 shards the 8 optimizer bytes over dp (the fp32 weights *are* the model, each
replica needs them whole). What mixed precision adds: autocast's 16-bit cast of each matmul weight is saved
for backward, so every microbatch in flight holds one cast of the stage's matmul weights (2 bytes each; its
cast cache lives for one autocast region, one forward action) until its backward frees it; full recomputation
keeps none of the blocks' casts between forward and backward (one block's, re-made, at a time). The DP
all-reduce and the tied-embedding gradient sum move the plan's `grad_reduce_dtype` (fp32 by default).
Compute time uses the profile's peak for the plan's precision (`DeviceProfile.peak_for`: a per-dtype
`peak_flops` map's bf16/fp16 entry; for fp32 the fp32 entry, or the tf32 entry when the plan sets
`training.allow_tf32` and the profile lists it: torch's default keeps fp32 matmuls in fp32); a one-figure profile
uses its figure for every precision (bf16 on accelerators, fp32 on the host profile `cpu`). Megatron TP: per block two all-reduces of the b*s*h activation
forward and two backward (sequence parallelism swaps each for an all-gather + reduce-scatter: the same bytes on
the wire).

Data-parallel sharding (`hetauto.core.dp_sharding`, one level per plan): `model_state_bytes` gives the model
states per level, `dp_shard_transient_bytes` what the level gathers or holds unsharded on top, `dp_shard_comm`
the per-microbatch and per-step collectives (ring formulas over the DP group's link); FSDP's prefetch overlap
is `prefetch_exposed`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate

from hetauto.core.cluster import Cluster, LinkSpec
from hetauto.core.dp_sharding import level_key, shards_optimizer
from hetauto.planner.layers import BYTES_BF16, LayerCost

GiB = float(1 << 30)
WEIGHT_GRAD_BYTES = 8.0  # fp32 weight (autocast's master: the model's own) + fp32 gradient
OPTIMIZER_BYTES = 8.0  # AdamW m and v, fp32
ADAM_BYTES_PER_PARAM = WEIGHT_GRAD_BYTES + OPTIMIZER_BYTES
ADAM_STEP_BYTES_PER_PARAM = 28.0  # read weight, grad, m, v (16); write weight, m, v (12); all fp32
FP32_BYTES = 4
WORKSPACE_FRACTION = 0.05  # allocator fragmentation, kernel scratch, communication buffers ...
WORKSPACE_MAX_BYTES = 2 * GiB  # ... at most this much
DP_BUCKET_BYTES = 25 * 2**20  # gradient bucket of the executor's overlapped DP reducer (DDP's default cap)


# ------------------------------------------------------------------------------------------ closed forms
def ring_allreduce_time(nbytes: float, d: int, bandwidth_Bps: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce of `nbytes` over `d` ranks: 2(d-1)/d * bytes / bandwidth + 2(d-1) latency steps."""
    if d <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (d - 1) / d * nbytes / bandwidth_Bps + 2.0 * (d - 1) * latency_s


def ring_allreduce_time_over(nbytes: float, hops: Sequence[tuple[float, float]]) -> float:
    """Ring all-reduce of `nbytes` over a ring whose hop i (rank i -> rank i+1, the last one back to rank 0) has
    (bandwidth B/s, latency s) `hops[i]`: every one of the 2(d-1) steps sends bytes/d down every hop at once, so
    the slowest hop paces the bytes, 2(d-1)/d * bytes / min(bandwidth); a step's message waits for the previous
    step's from the rank before, so the latencies add along 2(d-1) consecutive hops -- every hop twice but two
    neighbours once, the worst such walk: 2 sum(lat) - min(lat_i + lat_(i+1)). Equal to `ring_allreduce_time`
    when every hop is the same; a ring across two clusters pays the slow link's latency 4 times, not 2(d-1)."""
    d = len(hops)
    if d <= 1 or nbytes <= 0:
        return 0.0
    lat = [h[1] for h in hops]
    walk = 2.0 * sum(lat) - min(lat[i] + lat[(i + 1) % d] for i in range(d))
    return 2.0 * (d - 1) / d * nbytes / min(h[0] for h in hops) + walk


def ring_allgather_time(nbytes: float, d: int, bandwidth_Bps: float, latency_s: float = 0.0) -> float:
    """Ring all-gather (or reduce-scatter) whose *gathered* size is `nbytes`: (d-1)/d * bytes / bw + (d-1) lat."""
    if d <= 1 or nbytes <= 0:
        return 0.0
    return (d - 1) / d * nbytes / bandwidth_Bps + (d - 1) * latency_s


def megatron_tp_bytes_per_block(microbatch: float, seq_len: int, hidden: int, bytes_per_element: int = BYTES_BF16) -> float:
    """Bytes all-reduced by one transformer block per pass (forward, and again backward) under Megatron TP:
    two all-reduces (after attention and after the MLP) of the b*s*h activation."""
    return 2.0 * microbatch * seq_len * hidden * bytes_per_element


def adam_bytes_per_param(dp: int = 1, zero1: "bool | str" = False) -> float:
    """AdamW over fp32 parameters (any precision, see the module docstring): 16 B/param; ZeRO-1 divides the
    optimizer's 8 B (m, v) by dp, ZeRO-2 also the 4 B gradient, FSDP all 16 (`zero1`: a bool or a level key of
    hetauto.core.dp_sharding)."""
    level = level_key(zero1)
    if level == "none":
        return WEIGHT_GRAD_BYTES + OPTIMIZER_BYTES
    if level == "zero1":
        return WEIGHT_GRAD_BYTES + OPTIMIZER_BYTES / dp
    if level == "zero2":
        return FP32_BYTES + (FP32_BYTES + OPTIMIZER_BYTES) / dp
    return (WEIGHT_GRAD_BYTES + OPTIMIZER_BYTES) / dp


def dp_shard_transient_bytes(sums: "RangeSums", *, tp: int, dp: int, level: "bool | str", gather_bytes: int,
                             grad_bytes: int = FP32_BYTES) -> float:
    """Bytes a DP sharding level holds on top of its sharded model states (hetauto.core.dp_sharding), per
    device, U = the largest unit's parameters / tp, P = the stage's / tp, c = `gather_bytes` (the compute
    dtype), g = `grad_bytes` (grad_reduce_dtype): zero2: U x 4 (one unit's fp32 gradient before its
    reduce-scatter); fsdp: 2 U c (the gathered unit and the prefetched next) + U c (its unsharded gradient)
    + U g where g != c (that gradient cast for the reduce-scatter); fsdp-keep: P c (every parameter stays
    gathered while some microbatch is between its forward and backward) + U c + U g where g != c (one unit's
    gradient before its reduce-scatter). none, zero1 and dp 1: 0."""
    level = level_key(level)
    if dp <= 1 or level in ("none", "zero1"):
        return 0.0
    u, p = sums.max_unit_params / tp, sums.params / tp
    cast = u * grad_bytes if grad_bytes != gather_bytes else 0.0
    if level == "zero2":
        return u * FP32_BYTES
    if level == "fsdp":
        return 3.0 * u * gather_bytes + cast
    return p * gather_bytes + u * gather_bytes + cast


@dataclass(frozen=True, slots=True)
class ShardComm:
    """A DP sharding level's collectives for one device (seconds, before any overlap): per microbatch in its
    forward (`mb_fwd_s`) and its backward (`mb_bwd_s`); per step, `step_overlap_s` launched as the last
    backward produces gradients (overlapped with it as the DP all-reduce is) and `step_serial_s` that nothing
    hides (the all-gather of ZeRO-2's updated weights)."""

    mb_fwd_s: float = 0.0
    mb_bwd_s: float = 0.0
    step_overlap_s: float = 0.0
    step_serial_s: float = 0.0


def dp_shard_comm(sums: "RangeSums", *, tp: int, dp: int, level: "bool | str", gather_bytes: int,
                  grad_bytes: int, bandwidth_Bps: float, latency_s: float) -> ShardComm:
    """Ring collectives of ZeRO-2 and FSDP over a stage's DP group (`bandwidth_Bps`/`latency_s`: its link), per
    device, P = params / tp: an all-gather or reduce-scatter of X bytes gathered is (d-1)/d X / bw, plus (d-1)
    latencies per unit (FSDP issues one per layer slot). zero2: each microbatch's backward reduce-scatters P g;
    the step all-gathers the fp32 weights, P x 4 (serial, after the optimizer). fsdp: each microbatch's
    forward all-gathers P c, its backward all-gathers P c again and reduce-scatters P g. fsdp-keep: each
    microbatch's forward all-gathers P c and its backward only reduce-scatters P g (an upper bound: a unit
    still gathered for an earlier microbatch is not gathered again). none and zero1 (priced by
    `dp_allreduce_time`) and dp 1: all zero."""
    level = level_key(level)
    if dp <= 1 or level in ("none", "zero1"):
        return ShardComm()
    p, units = sums.params / tp, max(1, sums.units)

    def ring(nbytes: float, n_units: int) -> float:
        return (dp - 1) / dp * nbytes / bandwidth_Bps + n_units * (dp - 1) * latency_s

    gather, reduce = ring(p * gather_bytes, units), ring(p * grad_bytes, units)
    if level == "zero2":
        return ShardComm(mb_bwd_s=reduce, step_serial_s=ring(p * FP32_BYTES, 1))
    if level == "fsdp":
        return ShardComm(mb_fwd_s=gather, mb_bwd_s=gather + reduce)
    return ShardComm(mb_fwd_s=gather, mb_bwd_s=reduce)


def prefetch_exposed(comm_s: float, compute_s: float, units: int) -> float:
    """The part of a pass's per-unit collectives that its compute does not hide, FSDP-style prefetch (unit k+1's
    collective runs while unit k computes), `units` equal units: the first unit's comm / n is exposed and the
    other (n-1)/n overlap the pass's compute: comm / n + max(0, comm (n-1)/n - compute)."""
    if comm_s <= 0:
        return 0.0
    n = max(1, units)
    return comm_s / n + max(0.0, comm_s * (n - 1) / n - compute_s)


def inflight_microbatches(schedule: str, p: int, m: int, stage: int, *, virtual_chunks: int = 1,
                          extra_warmup: tuple[int, ...] = (), w_defer: tuple[int, ...] = ()) -> float:
    """Microbatches whose whole activations stage `stage` holds at its peak (in whole-stage units).

    1F1B / Virtual-1F1B: min(m, p - i + sum(extra_warmup[i:])); ZB-H1 / Virtual-ZB the same, counted from F to I
    (a microbatch between its I and its W keeps only its lean W set: `deferred_w_held`); ZB-V from its list
    (`hetauto.schedule.zb_windows`, the Evaluator); GPipe: m; interleaved (v chunks,
    each 1/v of the stage): min(m*v, 2(p-i-1) + (v-1)g + 1) chunks, i.e. that many / v whole-stage microbatches,
    g the microbatches per round (p when m is a multiple of p; m / max(1, m // p) otherwise, as the schedule runs them)."""
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved" and virtual_chunks > 1:
        v = virtual_chunks
        g = m // max(1, m // p) if m >= 1 else p
        return min(m * v, 2 * (p - stage - 1) + (v - 1) * g + 1) / v
    if schedule == "zb-v":  # F to W, without its list: hetauto.schedule.zb_v holds at most 2p chunk-microbatches
        return float(min(m, p))
    extra = sum(extra_warmup[stage:]) if schedule in ("virtual-1f1b", "virtual-zb") else 0
    return float(min(m, p - stage + extra))


def _zb_total(p: int, m: int, stage: int, extra_warmup: tuple[int, ...], w_defer: tuple[int, ...]) -> int:
    """ZB-H1 / Virtual-ZB: the most microbatches from F to W at once (hetauto.schedule.zb_inflight)."""
    d = w_defer[stage] if w_defer else stage  # -1: the stage runs plain B, 1F1B's count (as d = 0)
    return min(m, p - stage + max(d, 0) + sum(extra_warmup[stage:]))


def deferred_w_held(schedule: str, p: int, m: int, stage: int, *, extra_warmup: tuple[int, ...] = (),
                    w_defer: tuple[int, ...] = ()) -> float:
    """Microbatches between their I and their W (each keeping its lean W set, `deferred_w_bytes`) at the moment
    stage `stage` holds `inflight_microbatches` whole activations: ZB-H1 / Virtual-ZB min(m, p - i + d_i + k) -
    min(m, p - i + k), d_i its W deferral (default i), k the extra warm-up below it (Virtual-ZB) -- the F to W
    count less the F to I one, as along the generated lists (a test counts them). 0 on a stage that runs plain B
    (d_i = -1) and for every other schedule (ZB-V: from its list, the Evaluator)."""
    if schedule not in ("zb-h1", "virtual-zb"):
        return 0.0
    ks = tuple(extra_warmup) if schedule == "virtual-zb" else ()
    full = inflight_microbatches(schedule, p, m, stage, extra_warmup=ks)
    return float(_zb_total(p, m, stage, ks, w_defer)) - full


def deferred_w_peak(schedule: str, p: int, m: int, stage: int, *, w_defer: tuple[int, ...] = ()) -> float:
    """The most microbatches between their I and their W at once on stage `stage` (whole-stage units): ZB-H1 /
    Virtual-ZB min(m, d_i + 1), just after an I, when one microbatch fewer holds its whole activations than at
    `inflight_microbatches`' peak (`stage_memory` prices the larger of the two moments); 0 on a plain-B stage
    and for every other schedule."""
    if schedule not in ("zb-h1", "virtual-zb"):
        return 0.0
    d = w_defer[stage] if w_defer else stage
    return float(min(m, d + 1)) if d >= 0 else 0.0


def deferred_w_bytes(sums: RangeSums, *, tp: int, dp: int, microbatch: int) -> float:
    """Bytes one microbatch between its I and its W keeps on one device (the lean W,
    hetauto.runtime.split_backward; its activations are freed at I): per Linear its input and its output
    gradient (`RangeSums.wgrad_*`). None on the first stage: its I has no input gradient to make, so its W runs
    the whole backward (hetauto.runtime.executor, as torch's stage). Sequence parallelism does not shrink them:
    a Linear keeps the gathered input it multiplied."""
    if sums.has_embedding:
        return 0.0
    return microbatch / dp * ((sums.wgrad_sharded + sums.wgrad_input_sharded) / tp
                              + sums.wgrad_replicated + sums.wgrad_input_replicated)


# An offloading stage's W sets on the device, as the executor holds them (hetauto.runtime.w_offload.Offloader: at
# most one set leaving for host memory and one arriving for its W, the leaving one retired before a prefetch is
# allocated): one at the end of an F (the activations' peak), two just after an I (its own set leaving, the next
# W's arriving); tests/runtime/test_w_offload.py walks ZB-H1 and Virtual-ZB lists and finds exactly these.
OFFLOAD_PEAK_SETS = 1
OFFLOAD_DEVICE_SETS = 2


def offload_exposed(kept_bytes: float, host_link_Bps: float, *, i_s: float, fw_s: float) -> float:
    """Seconds per microbatch that offloading its W set adds, as the executor copies (hetauto.runtime.w_offload:
    side streams). In ZB-H1's steady F, I, W cycle the copy out (`kept_bytes` / `host_link_Bps`) runs from the
    end of an I until the compute stream retires it at the next W's prefetch (the next I's turn), under that
    cycle's W and F (`fw_s`); the copy in runs under the I before its W (`i_s`), in the other direction of the
    full-duplex link. What does not fit is exposed (the compute stream waits on the copy's event):
    max(0, c - i_s) + max(0, c - fw_s), c the one-way copy time. `host_link_Bps` is the device's share of its
    uplink (Evaluator.host_link_share). 0 where nothing moves (no set, or a host backend's infinite link).
    The warm-up (no W between two I: the out copy retires at the next I, a window of F + I) and cool-down
    (W after W: the prefetch under the previous W) are priced as the steady state."""
    if kept_bytes <= 0 or not math.isfinite(host_link_Bps):
        return 0.0
    c = kept_bytes / host_link_Bps
    return max(0.0, c - i_s) + max(0.0, c - fw_s)


def offload_host_bytes(kept_bytes: float, w_peak: float) -> float:
    """Host bytes one offloading device's W sets take: its most sets between I and W at once, each in its own
    host buffer (counted whole, the ones in transit too: their host copies exist while they move)."""
    return kept_bytes * w_peak


def workspace_bytes(memory_bytes: float) -> float:
    return min(WORKSPACE_FRACTION * memory_bytes, WORKSPACE_MAX_BYTES)


# ------------------------------------------------------------------------------------------ layer sums
@dataclass(frozen=True, slots=True)
class RangeSums:
    """Sums over a layer range [a, b), split by kind so each kind gets its own GEMM efficiency."""

    blocks: int
    has_embedding: bool
    has_head: bool
    block_flops_per_token: float
    head_flops_per_token: float
    params: float
    act_replicated: float  # per sample, no recompute
    act_sharded: float
    act_score: float
    act_block_input: float  # per sample: what a recomputed block keeps (2*s*h) summed over the blocks
    max_block_act: float  # one block's full activation per sample (the recompute transient)
    boundary_bytes_per_sample: float  # what the range's last layer sends onward
    param_tensors: int = 0  # parameter tensors (a per-tensor optimizer's fixed cost counts these)
    matmul_params: float = 0.0  # matmul weights autocast casts (and saves for backward) under mixed precision
    max_block_matmul: float = 0.0  # one block's (what a recomputed block re-casts at a time)
    nonblock_matmul: float = 0.0  # the embedding/head slots' share of matmul_params (kept under recompute)
    max_unit_params: float = 0.0  # the largest layer slot's parameters (an FSDP unit: embedding, a block, the head)
    units: int = 0  # layer slots in the range (FSDP units)
    # weight-gradient GEMM flops per token (one dW GEMM per weight matmul, the forward's own shape): the W part of
    # a split backward (zero-bubble schedules); the rest of the backward (dX GEMMs, attention, memory-bound) is I
    block_weight_flops_per_token: float = 0.0
    head_weight_flops_per_token: float = 0.0
    # per sample: what a deferred W keeps (LayerCost.wgrad_*): output gradients and Linear inputs, TP-sharded or whole
    wgrad_sharded: float = 0.0
    wgrad_replicated: float = 0.0
    wgrad_input_sharded: float = 0.0
    wgrad_input_replicated: float = 0.0


class LayerTable:
    """Prefix sums over the layer list, so every range query is O(1). Activation sums are in the layers' own
    compute dtype (`LayerCost.compute_bytes`; build one table per precision)."""

    def __init__(self, layers: tuple[LayerCost, ...]) -> None:
        self.layers = layers
        self.n = len(layers)
        blocks = [1 if la.kind == "block" else 0 for la in layers]

        def prefix(values: list[float]) -> list[float]:
            return [0.0, *accumulate(values)]

        self._blocks = prefix([float(b) for b in blocks])
        self._bflops = prefix([la.fwd_flops_per_token if la.kind == "block" else 0.0 for la in layers])
        self._params = prefix([float(la.params) for la in layers])
        self._tensors = prefix([float(la.param_tensors) for la in layers])
        self._rep = prefix([la.act_replicated_bytes for la in layers])
        self._sh = prefix([la.act_sharded_bytes for la in layers])
        self._sc = prefix([la.act_score_bytes for la in layers])
        self._binp = prefix([float(la.compute_bytes * la.seq_len * la.hidden) if la.kind == "block" else 0.0
                             for la in layers])
        self._max_block = max((la.act_bytes_per_sample for la in layers if la.kind == "block"), default=0.0)
        self._mm = prefix([float(la.matmul_params) for la in layers])
        self._mm_blocks = prefix([float(la.matmul_params) if la.kind == "block" else 0.0 for la in layers])
        self._max_block_mm = max((float(la.matmul_params) for la in layers if la.kind == "block"), default=0.0)
        self._max_block_params = max((float(la.params) for la in layers if la.kind == "block"), default=0.0)
        self._bwflops = prefix([min(2.0 * la.matmul_params, la.fwd_flops_per_token) if la.kind == "block" else 0.0
                                for la in layers])
        self._wg_sh = prefix([la.wgrad_sharded_bytes for la in layers])
        self._wg_rep = prefix([la.wgrad_replicated_bytes for la in layers])
        self._wg_in_sh = prefix([la.wgrad_input_sharded_bytes for la in layers])
        self._wg_in_rep = prefix([la.wgrad_input_replicated_bytes for la in layers])
        self._cache: dict[tuple[int, int], RangeSums] = {}

    def range(self, a: int, b: int) -> RangeSums:
        key = (a, b)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if not 0 <= a < b <= self.n:
            raise ValueError(f"layer range [{a}, {b}) is not inside [0, {self.n})")
        head = self.layers[-1]
        has_head = b == self.n and head.kind == "head"
        has_emb = a == 0 and self.layers[0].kind == "embedding"
        out = RangeSums(
            blocks=int(self._blocks[b] - self._blocks[a]), has_embedding=has_emb, has_head=has_head,
            block_flops_per_token=self._bflops[b] - self._bflops[a],
            head_flops_per_token=head.fwd_flops_per_token if has_head else 0.0,
            params=self._params[b] - self._params[a] + (head.tied_params if has_head and not has_emb else 0),
            act_replicated=self._rep[b] - self._rep[a], act_sharded=self._sh[b] - self._sh[a],
            act_score=self._sc[b] - self._sc[a], act_block_input=self._binp[b] - self._binp[a],
            max_block_act=self._max_block if self._blocks[b] > self._blocks[a] else 0.0,
            boundary_bytes_per_sample=self.layers[b - 1].boundary_bytes_per_sample,
            param_tensors=int(self._tensors[b] - self._tensors[a])
            + (head.tied_param_tensors if has_head and not has_emb else 0),
            matmul_params=self._mm[b] - self._mm[a],
            max_block_matmul=self._max_block_mm if self._blocks[b] > self._blocks[a] else 0.0,
            nonblock_matmul=(self._mm[b] - self._mm[a]) - (self._mm_blocks[b] - self._mm_blocks[a]),
            max_unit_params=max(self._max_block_params if self._blocks[b] > self._blocks[a] else 0.0,
                                float(self.layers[0].params) if has_emb else 0.0,
                                float(head.params + (head.tied_params if not has_emb else 0)) if has_head else 0.0),
            units=b - a,
            block_weight_flops_per_token=self._bwflops[b] - self._bwflops[a],
            head_weight_flops_per_token=min(2.0 * head.matmul_params, head.fwd_flops_per_token) if has_head else 0.0,
            wgrad_sharded=self._wg_sh[b] - self._wg_sh[a], wgrad_replicated=self._wg_rep[b] - self._wg_rep[a],
            wgrad_input_sharded=self._wg_in_sh[b] - self._wg_in_sh[a],
            wgrad_input_replicated=self._wg_in_rep[b] - self._wg_in_rep[a],
        )
        self._cache[key] = out
        return out


# ------------------------------------------------------------------------------------------ stage costs
@dataclass(frozen=True, slots=True)
class StageCompute:
    """One microbatch on one stage (per device). `*_compute_s` is GEMM + memory-bound work, `tp_*_s` the TP
    collectives; forward_s/backward_s are the sums (what the pipeline sees)."""

    fwd_compute_s: float
    bwd_compute_s: float
    tp_fwd_s: float
    tp_bwd_s: float
    flops_fwd: float  # per device, one microbatch
    bytes_moved: float  # activation bytes written per device per forward (memory-bound part)
    bwd_weight_s: float = 0.0  # the weight-gradient (W) part of bwd_compute_s: its dW GEMMs; the rest is I

    @property
    def weight_share(self) -> float:
        """W's share of the whole backward (TP collectives included, which stay in I: dW needs none)."""
        return self.bwd_weight_s / self.backward_s if self.backward_s > 0 else 0.0

    @property
    def forward_s(self) -> float:
        return self.fwd_compute_s + self.tp_fwd_s

    @property
    def backward_s(self) -> float:
        return self.bwd_compute_s + self.tp_bwd_s


def tp_link(cluster: Cluster, tp: int) -> LinkSpec:
    """TP groups are contiguous; inside one node they use the intra-node link, else the NIC."""
    return cluster.intra_node if tp <= cluster.devices_per_node else cluster.inter_node


def group_link(cluster: Cluster, devices: int) -> LinkSpec:
    """A ring over `devices` contiguous devices: its slowest hop is the NIC once it leaves the node."""
    return cluster.intra_node if devices <= cluster.devices_per_node else cluster.inter_node


def spanned_link(cluster: Cluster, devices: "tuple[int, ...] | list[int]") -> LinkSpec:
    """The slowest hop of a ring over exactly `devices` (not necessarily contiguous, e.g. DP replicas on a mixed
    cluster's node groups): the node's own links (its group's intra-node link) when they share one node, else
    the NIC."""
    nodes = {cluster.node_of(d) for d in devices}
    if len(nodes) > 1:
        return cluster.inter_node
    return cluster.intra_link(devices[0]) if len(devices) else cluster.intra_node


def stage_compute(sums: RangeSums, cluster: Cluster, *, seq_len: int, hidden: int, tp: int, dp: int,
                  microbatch: int, recompute: bool = False, flash_attention: bool = True,
                  element_bytes: int = BYTES_BF16, peak_flops: float | None = None) -> StageCompute:
    """Forward/backward time of one microbatch (split over dp replicas) on one device of a stage; `sums` from
    a LayerTable at `element_bytes` per activation element (the compute dtype: its memory-bound part and TP
    messages move those bytes); matmuls at `peak_flops` x efficiency (None: the profile's primary peak; the
    Evaluator passes `DeviceProfile.peak_for(precision, allow_tf32)`)."""
    dev = cluster.device
    b = microbatch / dp
    tokens = b * seq_len
    f_block = sums.block_flops_per_token * tokens / tp
    f_head = sums.head_flops_per_token * tokens / tp
    t = 0.0
    tw = 0.0  # the dW GEMMs: each weight matmul's forward GEMM again, at the same efficiency
    if f_block > 0:
        gemm = 2.0 * tokens * hidden * hidden / tp
        tb = f_block / dev.achieved_flops(gemm, tp, peak_flops)
        t += tb
        tw += tb * sums.block_weight_flops_per_token / sums.block_flops_per_token
    if f_head > 0:
        th = f_head / dev.achieved_flops(f_head, tp, peak_flops)
        t += th
        tw += th * sums.head_weight_flops_per_token / sums.head_flops_per_token
    score = 0.0 if flash_attention else sums.act_score
    moved = b * (sums.act_replicated + (sums.act_sharded + score) / tp)
    if sums.has_embedding:
        moved += tokens * hidden * element_bytes
    t += moved / dev.memory_bandwidth_Bps
    bwd = 2.0 * t + (t if recompute else 0.0)
    tp_f = tp_b = 0.0
    if tp > 1:
        link = tp_link(cluster, tp)
        msg = b * seq_len * hidden * element_bytes
        n_ar = 2 * sums.blocks + (1 if sums.has_embedding else 0)
        tp_f = n_ar * ring_allreduce_time(msg, tp, link.bandwidth_Bps, link.latency_s)
        tp_b = tp_f * (2.0 if recompute else 1.0)
    return StageCompute(t, bwd, tp_f, tp_b, f_block + f_head, moved, tw)


def stage_memory(sums: RangeSums, cluster: Cluster, *, tp: int, dp: int, microbatch: int, inflight: float,
                 recompute: bool = False, zero1: "bool | str" = False, sequence_parallel: bool = False,
                 flash_attention: bool = True, cast_bytes: int = 0, grad_bytes: int = FP32_BYTES,
                 w_held: float = 0.0, w_peak: float | None = None, w_offload: bool = False) -> float:
    """One device's peak bytes: model states + (activations + weight casts) x in-flight microbatches +
    `deferred_w_bytes` x `w_held` (microbatches between I and W at that moment, `deferred_w_held`) + workspace;
    with `w_peak` (the most between I and W at once, `deferred_w_peak`) the larger of that moment and the one
    when w_peak - w_held fewer hold whole activations and w_peak their W sets (every moment of a list holds at
    most inflight + w_held microbatches from F to W, at most inflight from F to I and w_peak from I to W; one of
    the two moments is the peak whatever the sizes, and ZB-H1's lists reach both); with `w_offload` the device
    holds at most OFFLOAD_PEAK_SETS of those W sets at the first moment and OFFLOAD_DEVICE_SETS at the second,
    the rest wait in host memory (`offload_host_bytes`). `sums` from a
    LayerTable in the plan's compute dtype; `cast_bytes` the bytes per element of autocast's weight casts (2
    under mixed precision, 0 for fp32: nothing is cast). `zero1`: False/True or a DP sharding level key
    (hetauto.core.dp_sharding): the states per `adam_bytes_per_param`, plus
    `dp_shard_transient_bytes` (gathered at the compute dtype, reduced at `grad_bytes`); fsdp casts at its
    all-gather, so it keeps no per-microbatch weight casts."""
    return stage_memory_parts(sums, cluster, tp=tp, dp=dp, microbatch=microbatch, recompute=recompute, zero1=zero1,
                              sequence_parallel=sequence_parallel, flash_attention=flash_attention,
                              cast_bytes=cast_bytes, grad_bytes=grad_bytes).peak(inflight, w_held, w_peak, w_offload)


@dataclass(frozen=True, slots=True)
class MemoryParts:
    """`stage_memory`'s terms that do not depend on what the schedule keeps in flight: the planner prices one
    stage at many in-flight counts (every cut, schedule and warm-up depth), so these are computed once."""

    states: float  # model states and DP sharding's transient buffers
    per_mb: float  # activations and weight casts per microbatch in flight
    transient: float  # a re-materialised block, its casts
    kept: float  # one microbatch's deferred W set (`deferred_w_bytes`)
    workspace: float  # `workspace_bytes` of the device

    def peak(self, inflight: float, w_held: float = 0.0, w_peak: float | None = None,
             w_offload: bool = False) -> float:
        """`stage_memory` at these in-flight figures (the same operations in the same order)."""
        per_mb, kept = self.per_mb, self.kept
        live = per_mb * inflight + kept * (min(w_held, OFFLOAD_PEAK_SETS) if w_offload else w_held)
        if w_peak is not None and w_peak > w_held:
            live = max(live, per_mb * (inflight - (w_peak - w_held))
                       + kept * (min(w_peak, OFFLOAD_DEVICE_SETS) if w_offload else w_peak))
        return self.states + live + self.transient + self.workspace


def stage_memory_parts(sums: RangeSums, cluster: Cluster, *, tp: int, dp: int, microbatch: int,
                       recompute: bool = False, zero1: "bool | str" = False, sequence_parallel: bool = False,
                       flash_attention: bool = True, cast_bytes: int = 0, grad_bytes: int = FP32_BYTES) -> MemoryParts:
    """`stage_memory`'s in-flight-independent terms (see there)."""
    b = microbatch / dp
    level = level_key(zero1)
    states = sums.params / tp * adam_bytes_per_param(dp, level)
    states += dp_shard_transient_bytes(sums, tp=tp, dp=dp, level=level, gather_bytes=cast_bytes or FP32_BYTES,
                                       grad_bytes=grad_bytes)
    if level in ("fsdp", "fsdp-keep") and dp > 1:
        cast_bytes = 0
    score = 0.0 if flash_attention else sums.act_score
    sp = tp if sequence_parallel else 1
    if recompute and sums.blocks:
        # blocks keep only their input; embedding/head keep theirs; one block is re-materialised at a time
        full_blocks = sums.act_replicated + sums.act_sharded + sums.act_score  # per sample, incl. non-blocks
        non_block = full_blocks - sums.blocks * sums.max_block_act
        per_mb = b * (sums.act_block_input / sp + max(non_block, 0.0) / tp)
        transient = b * sums.max_block_act / tp
        casts, cast_transient = sums.nonblock_matmul, sums.max_block_matmul
    else:
        per_mb = b * (sums.act_replicated / sp + (sums.act_sharded + score) / tp)
        transient = 0.0
        casts, cast_transient = sums.matmul_params, 0.0
    per_mb += casts / tp * cast_bytes
    transient += cast_transient / tp * cast_bytes
    kept = deferred_w_bytes(sums, tp=tp, dp=dp, microbatch=microbatch)
    return MemoryParts(states, per_mb, transient, kept, workspace_bytes(cluster.device.memory_bytes))


def dp_grad_bytes(sums: RangeSums, *, tp: int, element_bytes: float = FP32_BYTES) -> float:
    """Gradient bytes one device all-reduces: its 1/tp of the stage's parameters at `element_bytes` each (the
    plan's grad_reduce_dtype; fp32 by default)."""
    return sums.params / tp * element_bytes


def dp_allreduce_time(sums: RangeSums, cluster: Cluster, *, tp: int, dp: int, element_bytes: float = FP32_BYTES,
                      bandwidth_Bps: float | None = None, latency_s: float | None = None) -> float:
    """Gradient all-reduce (`element_bytes` per gradient) of one device's shard over its dp peers (ZeRO-1's
    reduce-scatter + all-gather moves the same bytes). `bandwidth_Bps`/`latency_s` replace the group's link
    (a measured collective bandwidth, e.g. gloo over loopback when every rank shares one host)."""
    if dp <= 1:
        return 0.0
    link = group_link(cluster, tp * dp)
    return ring_allreduce_time(dp_grad_bytes(sums, tp=tp, element_bytes=element_bytes), dp,
                               bandwidth_Bps or link.bandwidth_Bps, link.latency_s if latency_s is None else latency_s)


def dp_buckets(grad_bytes: float, bucket_bytes: float = DP_BUCKET_BYTES) -> tuple[int, float]:
    """(bucket count, bytes of the last-launched bucket) of a stage's gradients. Why it matters: buckets are
    all-reduced as soon as backward fills them, but the last one is only full when the last backward ends,
    so a stage whose gradients fit in one bucket cannot overlap its all-reduce with backward at all."""
    if grad_bytes <= 0:
        return (0, 0.0)
    n = max(1, math.ceil(grad_bytes / bucket_bytes))
    return (n, grad_bytes - (n - 1) * bucket_bytes)


def exposed_allreduce_span(backward_s: float, allreduce_s: float, grad_bytes: float,
                           bucket_bytes: float = DP_BUCKET_BYTES) -> float:
    """Time from the start of the last backward until the overlapped gradient all-reduce ends:
    max(whole all-reduce, backward + the last bucket's share), bandwidth-proportional. One bucket:
    backward + all-reduce (no overlap)."""
    n, last = dp_buckets(grad_bytes, bucket_bytes)
    if n == 0:
        return allreduce_s
    return max(allreduce_s, backward_s + allreduce_s * last / grad_bytes)


def optimizer_time(sums: RangeSums, cluster: Cluster, *, tp: int, dp: int, zero1: "bool | str" = False) -> float:
    """Adam step: memory-bound over this device's parameters (its 1/dp shard with any sharding level)."""
    params = sums.params / tp / (dp if shards_optimizer(zero1) else 1)
    return params * ADAM_STEP_BYTES_PER_PARAM / cluster.device.memory_bandwidth_Bps


def measured_optimizer_time(sums: RangeSums, *, tp: int, dp: int, per_tensor_s: float, per_param_s: float,
                            zero1: "bool | str" = False) -> float:
    """Per-tensor optimizer step as measured on this host: tensors x per_tensor_s + this device's parameters
    x per_param_s. Why: a single-tensor AdamW on a CPU pays a fixed dispatch cost per parameter tensor
    (~0.1 ms: a dozen eager ops) that dwarfs the bytes for small tensors; TP shards each tensor, it does not
    change how many there are."""
    params = sums.params / tp / (dp if shards_optimizer(zero1) else 1)
    return sums.param_tensors * per_tensor_s + params * per_param_s


# ------------------------------------------------------------------------------------------ boundaries
@dataclass(frozen=True, slots=True)
class BoundaryCost:
    """One direction of one stage boundary for one microbatch: `cross_bytes` on the network, `serial_s` its
    serialization, `latency_s` the one-way latency plus the receiver-side local step (broadcast/all-gather);
    a `host` transport's device->host copy of one flow's bytes on its sending device (`copy_out_s`) and
    host->device copy on its receiving device (`copy_in_s`), serial with the network transfer."""

    cross_bytes: float
    serial_s: float
    latency_s: float
    local_s: float
    copy_out_s: float = 0.0
    copy_in_s: float = 0.0

    @property
    def total_s(self) -> float:
        """One message alone: copy out, serialize, copy in, latency."""
        return self.copy_out_s + self.serial_s + self.copy_in_s + self.latency_s

    @property
    def busy_s(self) -> float:
        """How long a message holds the slowest of copy-out, network and copy-in: the spacing of a stream of
        messages. Why the slowest and not the sum: the copy engines and the NIC are separate resources (pinned
        buffers, asynchronous copies), so message k+1 is copied out while message k is on the wire; a tandem of
        such stations passes equal messages at the bottleneck's rate, each one delayed by the others' times."""
        return max(self.serial_s, self.copy_out_s, self.copy_in_s)


def boundary_flows(method: str, nbytes: float, src: tuple[int, int], dst: tuple[int, int]) -> tuple[int, float]:
    """(concurrent flows, bytes per flow) one microbatch's activation of `nbytes` puts on the link between
    layouts `src` and `dst` ((dp, tp) each) under `method`: what `boundary_cost` serializes, flow by flow."""
    dp_s, tp_s = src
    dp_d, tp_d = dst
    if method == "lanes":
        lanes = min(dp_s * tp_s, dp_d * tp_d)
        return lanes, tp_d * nbytes / lanes
    if method == "leader-broadcast":
        k = min(dp_s, dp_d)
        return k, nbytes / k
    if method == "scatter-allgather":
        k = min(dp_s, dp_d) * min(tp_s, tp_d)
        return k, nbytes / k
    raise ValueError(f"unknown resharding method {method!r}; use lanes, leader-broadcast or scatter-allgather")


def boundary_cost(method: str, nbytes: float, src: tuple[int, int], dst: tuple[int, int], link: LinkSpec,
                  local: LinkSpec, host_links: tuple[float, float] = (math.inf, math.inf)) -> BoundaryCost:
    """Per resharding.md. `src`/`dst` are (dp, tp) layouts; `nbytes` = S (one microbatch's activation);
    `link` the per-device-pair network link, `local` the destination's intra-node link; `host_links` the
    sending and receiving devices' host-link bandwidths for a `host` transport (inf: that side copies nothing,
    e.g. a CPU backend or a `device` transport): each flow's bytes (serial_s x bandwidth) are copied out on
    its sending device and in on its receiving one."""
    dp_s, tp_s = src
    dp_d, tp_d = dst
    bw = link.bandwidth_Bps
    if method == "lanes":
        cross = tp_d * nbytes
        lanes = min(dp_s * tp_s, dp_d * tp_d)
        bc = BoundaryCost(cross, cross / (lanes * bw), link.latency_s, 0.0)
    elif method == "leader-broadcast":
        ser = nbytes / (min(dp_s, dp_d) * bw)
        loc = (local.latency_s + nbytes / dp_d / local.bandwidth_Bps) if tp_d > 1 else 0.0
        bc = BoundaryCost(nbytes, ser, link.latency_s + loc, loc)
    elif method == "scatter-allgather":
        k = min(tp_s, tp_d)
        ser = nbytes / (min(dp_s, dp_d) * k * bw)
        loc = ring_allgather_time(nbytes / dp_d, tp_d, local.bandwidth_Bps, local.latency_s)
        bc = BoundaryCost(nbytes, ser, link.latency_s + loc, loc)
    else:
        raise ValueError(f"unknown resharding method {method!r}; use lanes, leader-broadcast or scatter-allgather")
    flow = bc.serial_s * bw  # the bytes one sending device puts on the wire
    out_bw, in_bw = host_links
    return replace(bc, copy_out_s=flow / out_bw, copy_in_s=flow / in_bw)  # bytes / inf = 0.0: no copy
