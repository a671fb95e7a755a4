"""The per-rank interpreter: run a plan's schedule action lists for real on torch.distributed, on the
rank's own device, through the backend contract.

Every rank of a stage runs that stage's action list (hetauto.schedule.schedule_for_plan):
  RECV_F/RECV_B  post the receives of a boundary transfer (hetauto.runtime.boundary, over the boundary's
                 transport) early; the compute that needs them waits just before it runs;
  F / B          forward / backward of the stage's module (DTensor TP inside the stage) on the rank's
                 device, under the plan's precision (hetauto.runtime.mixed_precision), throttled to the
                 device's speed factor when emulating;
  I / W          the backward split (zero-bubble schedules, hetauto.runtime.split_backward, the lean W): I
                 runs the backward with the graph freed, computing the input gradient (sent upstream by the
                 SEND_B after it) and every gradient but the Linears' weights', keeping each Linear's input
                 and output gradient; W later computes those weight gradients; the first stage has no input
                 gradient, so its W runs the whole backward, as torch's pipelining stage does;
  SEND_F/SEND_B  post the sends asynchronously (waited at the end of the step, before OPTIM);
  REDUCE_GRAD    DP gradient SUM (bucketed; overlapped with the step's last backward when dp > 1), in the
                 plan's gradient-reduction dtype, then the tied-embedding sum between first and last stage;
                 with zero1 the tied sum first, then a reduce-scatter (hetauto.runtime.zero1);
  OPTIM          AdamW (hetauto.runtime.reference.make_optimizer) on the fp32 master weights; with fp16,
                 unscale and skip the step when any rank's gradients overflowed; with zero1 AdamW steps this
                 rank's owned slice and the updated slices are all-gathered.
Each action type has its handler (`StageExecutor._handlers`); a step's state lives in one `_StepState`.

Devices: the rank's device comes from its stage's backend (hetauto.runtime.devices.RankDevice): the stage
module, its optimizer state and every buffer live there; step and action times come from the backend's
timer (device events where the vendor has them). Nothing here names a vendor.

Messages are tagged per (boundary, microbatch, direction), so the order in which the two sides post them
does not matter on transports with tags (gloo); on tag-less device transports (nccl, hccl) each direction of
a boundary has its own group and both sides post in schedule order. The loss follows
hetauto.runtime.reference: each last-stage dp shard backprops sum-CE / (global_batch * seq_len),
gradients are summed. So uneven DP shares (`StagePlan.dp_shares`: replica d runs its own number of rows of
every microbatch) need no reweighting: each replica's gradient already carries its rows' weight, and the
sum over replicas is the full batch's gradient.

Interleaved 1F1B (v > 1 chunks per stage): a rank builds one module per chunk (slots from
hetauto.core.chunks.chunk_layers, initialised from (seed, slot) like every stage, so the chain of virtual
stages is the single-process model), runs its action list keyed by virtual stage (`c * p + r`), and
tags boundary k = virtual stage k -> k+1. A stage receives from stage r-1 and sends to stage r+1 (mod p):
the wrap from stage p-1's chunk c to stage 0's chunk c+1 is one more transfer plan (last boundary's
resharding method, as the cost model prices it). Each chunk's REDUCE_GRAD sums that chunk's gradients
over dp (its own overlapped reducer, armed before that chunk's last backward); one AdamW and one
checkpoint module (ChunkedStage: slots by global name) cover all chunks.

ZB-V (`zb-v`, two chunks per stage in a V, hetauto.core.chunks.slot_of): chunk 0 runs down the stages, chunk 1
back up over each boundary's backward transport, the last stage hands its chunk 0's output to its own chunk 1
in place (boundary.LocalRoute, as torch's runtime does), and stage 0, holding the head, reports the loss.

The interpreter reports plain JSON-able values (`RankReport.to_dict`), so `hetauto run` can collect
them from files and tests from `run_ranks`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from hetauto.core.chunks import chunk_layers, effective_chunks, schedule_placement, slot_of
from hetauto.core.comm import Communicator
from hetauto.core.errors import PlanMismatch
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan
from hetauto.core.run_config import RunConfig
from hetauto.core.stage_backends import DEFAULT_BACKEND
from hetauto.runtime import split_backward, w_offload
from hetauto.runtime.boundary import BoundaryRoute, LocalRoute
from hetauto.runtime.data import dp_shard, microbatch
from hetauto.runtime.devices import RankDevice
from hetauto.runtime.executable import check_executable
from hetauto.runtime.groups import RankGroups
from hetauto.runtime.mixed_precision import Precision
from hetauto.runtime.optim import LRSchedule, clip_coefficient, local_sq_norm
from hetauto.runtime.reference import optimizer_for
from hetauto.runtime.resharding import TransferPlan, plan_transfer
from hetauto.runtime.stage import ChunkedStage, StageModule, build_chunks
from hetauto.runtime.throttle import Throttle
from hetauto.runtime.zero1 import state_bytes
from hetauto.schedule.actions import Action, ActionType, pair_ordered
from hetauto.schedule.for_plan import schedule_for_plan

__all__ = ["RankLocal", "RankReport", "StageExecutor", "rank_actions", "run_rank", "check_executable"]

A = ActionType


@dataclass(frozen=True, slots=True)
class RankLocal:
    """What only this rank knows, next to the run configuration every rank reads (hetauto.core.run_config): its
    emulated speed, where its step lines go, and the switches tests and benchmarks turn."""

    speed_factor: float = 1.0  # < 1 emulates a slower device (Throttle)
    overlap_dp: bool = True  # DP all-reduce overlapped with the last backward
    record: bool = True  # keep the lead rank's timeline
    step_log: Callable[[str], None] | None = None  # takes each step's line (hetauto.runtime.step_log.step_line)


# The lead ranks keep the timeline and the compute times of the newest steps only (RECORDED_STEPS to twice that,
# trimmed every RECORDED_STEPS steps): what the report's consumers read (the last step's timeline, the steady
# median of the compute times) at a memory cost that does not grow with the run (it grew ~1.7 KiB a step, and a
# long run's report would have outgrown the control store's frame bound).
RECORDED_STEPS = 64


@dataclass(slots=True)
class RankReport:
    """What one rank measured. `losses` only on last-stage tp-index-0 ranks (sum them over dp)."""

    rank: int
    stage: int
    dp_index: int
    tp_index: int
    losses: list[float] | None
    step_s: list[float]
    sent_bytes: dict[str, int]
    events: list[list[Any]] = field(default_factory=list)  # [step, stage, kind, mb, start_s, end_s]: the newest
    # steps only (RECORDED_STEPS to twice that: a run of any length keeps and sends a bounded timeline)
    # lead ranks: per step, the thread CPU seconds of the F, B and OPTIM actions (the work without waits, throttle
    # sleeps or time-slicing: wall / CPU is what the rest of the host cost this stage)
    compute_cpu_s: dict[str, list[float]] = field(default_factory=dict)
    # lead ranks: per step, the device time of the F, B and OPTIM actions (the backend's timer)
    compute_device_s: dict[str, list[float]] = field(default_factory=dict)
    throttled_s: float = 0.0
    start_step: int = 0  # the first step this run trained (> 0 when resumed from a checkpoint)
    checkpoints: list[str] = field(default_factory=list)  # directories written by this run (rank 0 only)
    backend: str = "cpu"
    device: str = "cpu:0"
    dist_backend: str = "gloo"
    precision: str = "fp32"
    peak_memory_bytes: int = 0  # the backend's memory_stats peak for this rank's device
    transports: list[str] = field(default_factory=list)  # per forward boundary (stage_backends.boundary_pairs)
    overflow_steps: int = 0  # fp16: steps skipped because some rank's gradients overflowed
    nonfinite_steps: list[int] = field(default_factory=list)  # steps whose loss/gradients were nan or inf
    # checkpoints not written because the weights were non-finite (--on-nonfinite continue): [step, why]
    skipped_checkpoints: list[list[Any]] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)  # the learning rate each step trained with
    grad_norms: list[float] = field(default_factory=list)  # with clipping: each step's global norm before it
    eval_losses: list[list[float]] = field(default_factory=list)  # [step, share of the held-out loss] (last stage)
    # AdamW's per-element state (m and v) this rank holds at the end: 8 B per parameter, 1/dp of them with zero1
    optimizer_state_bytes: int = 0
    # island runs (hetauto.runtime.island_sync), holders only: one row per outer sync this rank took part in,
    # {"step", "fragment", "bytes" (this holder's payload times its peers), "sync_s", "exposed_s", "peers",
    # "phases" (send_s, exchange_s, wait_s, merge_s, step_s, posted_at: island_inflight.InFlight.phases)}
    outer_syncs: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values; `outer_syncs` only when there are some (an ordinary run's report is as before)."""
        doc = asdict(self)
        if not self.outer_syncs:
            del doc["outer_syncs"]
        return doc


_RECV_F, _RECV_B, _F, _SEND_F, _B, _SEND_B, _REDUCE, _OPTIM, _I, _W = range(10)
_CODES = {A.RECV_F: _RECV_F, A.RECV_B: _RECV_B, A.F: _F, A.SEND_F: _SEND_F, A.B: _B, A.SEND_B: _SEND_B,
          A.REDUCE_GRAD: _REDUCE, A.OPTIM: _OPTIM, A.I: _I, A.W: _W}


def rank_actions(plan: Plan, stage: int) -> tuple[Action, ...]:
    """The action list stage `stage` runs. ZB-V's chunk 1 sends its activations up over the boundary that carries
    chunk 0's gradients (one transport per direction), so there each rank posts its receives from a peer in the
    order that peer sends them (`pair_ordered`, as the torch export does): a tag-less device transport matches
    messages by order alone, and same-shaped messages would otherwise swap silently. Loop placement keeps one kind
    per direction, already in order."""
    sched = schedule_for_plan(plan)
    return (pair_ordered(sched) if sched.placement == "v" else sched.ranks)[stage]


def _compile(a: Action, last_b: bool, stage: int, p: int) -> tuple[int, int, bool, int, int]:
    """(opcode, microbatch, is its virtual stage's last backward of the step, virtual stage, chunk): the
    action list as the interpreter loop reads it."""
    code = _CODES.get(a.type)
    if code is None:
        raise PlanMismatch(f"stage {stage}: the executor cannot run action {a} (type {a.type.value})")
    return code, a.microbatch, last_b, a.stage, a.stage // p


class _StepState:
    """What one iteration holds between its actions, keyed by (virtual stage, microbatch) (`vs * m + k`):
    with interleaving one rank holds the same microbatch in several chunks at once."""

    __slots__ = ("step", "batch", "recv_f", "recv_b", "inputs", "held", "outputs", "sends", "watch", "loss", "t",
                 "deferred")

    def __init__(self, step: int, batch: Any) -> None:
        self.step, self.batch = step, batch
        self.recv_f: dict[int, Any] = {}
        self.recv_b: dict[int, Any] = {}
        self.inputs: dict[int, torch.Tensor] = {}
        self.held: dict[int, Any] = {}  # forward-input receives whose buffer autograd still reads
        self.outputs: dict[int, torch.Tensor] = {}
        self.deferred: dict[int, Any] = {}  # I done, W to come: what the weight-gradient step needs
        self.sends: list[Any] = []
        self.watch: list[list[Any]] = []  # recording: transfers not yet seen complete
        self.loss: torch.Tensor | float = 0.0
        self.t = 0.0  # wall time the current action started (recording)


def _default_device() -> RankDevice:
    from hetauto.backends import get_backend

    host = get_backend(DEFAULT_BACKEND)
    return RankDevice(host, 0, host.device(0), host.capabilities(0))


def load_published_weights(chunks: list[StageModule], cfg: ModelConfig, folder: str, seq_len: int) -> None:
    """Published Hugging Face weights (hetauto.runtime.hf_weights) into these chunks' slots only, before TP or
    FSDP shard them."""
    from hetauto.runtime.hf_weights import load_hf_weights

    for c in chunks:
        load_hf_weights({int(k): m for k, m in c.layers.items()}, cfg, folder, seq_len)


def _tp_sharded(t: torch.Tensor) -> bool:
    """Whether `t` is split across the stage's TP ranks (else each TP rank holds the same copy): a DTensor not
    Replicate on its "tp" mesh dim (FSDP with tp > 1: the (dp, tp) mesh; a "dp"-only mesh is FSDP's split of a
    TP-replicated parameter), or on any dim of an unnamed mesh (TP's 1-D mesh; FSDP's at tp 1, tp index 0)."""
    placements = getattr(t, "placements", None)
    if placements is None:
        return False
    names = t.device_mesh.mesh_dim_names  # type: ignore[attr-defined]
    if names:
        return "tp" in names and not placements[names.index("tp")].is_replicate()
    return any(not pl.is_replicate() for pl in placements)


class StageExecutor:
    """One rank's stage module, optimizer, transfer plans and action list; `step(i)` runs one iteration."""

    def __init__(self, groups: RankGroups, plan: Plan, cfg: ModelConfig, run: RunConfig,
                 device: RankDevice | None = None, precision: str = "fp32", local: RankLocal = RankLocal()) -> None:
        """The rank's stage, built as a chain of named steps (like torchtitan's `parallelize_llama`): the stage's
        chunks, their published weights, TP, FSDP, ZeRO-1 with the optimizer, the action list, the transfers,
        the data and the records."""
        check_executable(plan)
        self.g, self.plan, self.cfg, self.me = groups, plan, cfg, groups.me
        self.training, self.data_cfg, self.local = run.training, run.data, local
        self.island = run.island  # an island plan's island: its rows of each global batch
        self.schedule = LRSchedule.of(run.training)
        self.dev = device if device is not None else _default_device()
        self.device = self.dev.device
        self.mp = Precision(precision, self.device.type, plan.training.grad_reduce_dtype)
        self.scaler = self.mp.loss_scaler()
        # interleaved: v chunks per stage, virtual stage c*p + r = chunk c of stage r (hetauto.core.chunks)
        self.v = effective_chunks(plan.schedule.name, plan.schedule.virtual_chunks)
        self.n_virtual = plan.num_stages * self.v
        chunks = build_chunks(cfg, chunk_layers(plan)[self.me.stage], self.training.seed,
                              self.me.stage_plan.recompute)
        if run.checkpoint.init_from is not None:  # published weights, this stage's slots only, before TP shards them
            load_published_weights(chunks, cfg, run.checkpoint.init_from, plan.seq_len)
        chunks = [c.to(self.device) for c in chunks]
        # dp_sharding fsdp: FSDP2 over the stage's DP group does the DP gradient sum (hetauto.runtime.fsdp)
        self.fsdp = plan.dp_level in ("fsdp", "fsdp-keep") and groups.dp_group is not None
        self.zero1 = plan.dp_level == "zero1" and groups.dp_group is not None
        mesh2d = self._fsdp_tp_mesh() if self.fsdp and groups.tp_mesh is not None else None
        chunks = self._apply_tp(chunks, mesh2d)
        chunks = self._apply_fsdp(chunks, mesh2d)
        self.chunks: tuple[StageModule, ...] = tuple(chunks)
        # one module for the optimizer and checkpoints: the stage itself, or all its chunks by global slot name
        self.stage: StageModule | ChunkedStage = chunks[0] if self.v == 1 else ChunkedStage(chunks)
        self.partitions: list[Any] = self._apply_zero1()
        self.optimizer = self._build_optimizer()
        self._build_actions()
        self._build_transfers()
        self._build_data()
        self._init_records()

    # ------------------------------------------------------------------ the construction steps
    def _apply_tp(self, chunks: list[StageModule], mesh2d: Any) -> list[StageModule]:
        """DTensor TP inside the stage (a plain DP stage too: its modules become DTensor-ready, as before)."""
        if self.g.tp_mesh is None and self.g.dp_group is None:
            return chunks
        # imported here: DTensor's import costs ~0.7 s per process, and a tp = dp = 1 rank needs none of it
        from hetauto.runtime.tensor_parallel import parallelize_stage

        mesh = mesh2d["tp"] if mesh2d is not None else self.g.tp_mesh
        return [parallelize_stage(c, mesh) for c in chunks]

    def _apply_fsdp(self, chunks: list[StageModule], mesh2d: Any) -> list[StageModule]:
        """FSDP2 over the stage's DP group; with tp > 1 TP shards on the "tp" and FSDP2 on the "dp" sub-mesh of one
        2-D mesh (FSDP2 needs them related)."""
        if not self.fsdp:
            return chunks
        from hetauto.runtime.fsdp import shard_stage

        mp = self.mp
        return [shard_stage(c, self.g.dp_group, self.device.type, reshard_after_forward=self.plan.reshard_after_forward,
                            param_dtype=mp.compute_dtype if mp.mixed else None, reduce_dtype=mp.reduce_dtype,
                            mesh=mesh2d["dp"] if mesh2d is not None else None) for c in chunks]

    def _apply_zero1(self) -> list[Any]:
        """zero1 (hetauto.runtime.zero1): per chunk, its parameters split over the DP group; AdamW steps the owned
        pieces only (m and v for 1/dp of the stage), the updated pieces are all-gathered after the step."""
        if not self.zero1:
            return []
        from hetauto.runtime.zero1 import Zero1Partition

        lay = self.me.layout
        dp_ranks = sorted(lay.rank(d, self.me.tp_index) for d in range(lay.dp))
        self.dp_comm = Communicator(self.g.dp_group, dp_ranks, timeout_s=self.g.world.timeout_s,
                                    backend=self.dev.dist_backend)
        return [Zero1Partition(c, self.dp_comm, self.mp.reduce_dtype) for c in self.chunks]

    def _build_optimizer(self) -> torch.optim.Optimizer:
        """AdamW over what this rank steps: the stage's parameters, or (zero1) its owned pieces of them."""
        if self.zero1:
            from hetauto.runtime.zero1 import piece_params

            params: Any = piece_params(self.partitions)
        else:
            params = self.stage.parameters()
        return optimizer_for(params, self.training)

    def _build_actions(self) -> None:
        """The action list as the interpreter reads it, the throttle, the split backward's lean W and its offload,
        and the overlapped DP reducers."""
        plan, me, chunks = self.plan, self.me, self.chunks
        self.actions: tuple[Action, ...] = rank_actions(plan, me.stage)
        # the emulated cluster's speed times the device's own (1.0 on real devices; the mock backend's
        # HETAUTO_MOCK_SPEED), so a slow emulated device needs no branch here
        speed = self.local.speed_factor * self.dev.backend.speed_factor(self.dev.index)
        self.throttle = Throttle(speed) if speed != 1.0 else None
        # one reducer per chunk, armed before that chunk's last backward of the step; a split backward accumulates
        # the Linears' weight gradients at W and the other parameters' at I, so no single point sees every last
        # gradient in hook order: REDUCE_GRAD sums them after the last W
        self.split = split = any(a.type is A.W for a in self.actions)
        # the lean W (hetauto.runtime.split_backward) on every chunk that runs I; the first virtual stage's W runs
        # its whole backward, so its chunk keeps plain Linears
        self.lean = tuple(split_backward.LeanW.install(ch) if split and (me.stage, i) != (0, 0) else None
                          for i, ch in enumerate(chunks))
        # this stage's deferred W sets wait in host memory between I and W (hetauto.runtime.w_offload)
        self.w_offload = plan.schedule.offloads(me.stage)
        self.offload = w_offload.Offloader(self.dev.backend, self.device, self.dev.backend.pin_host_memory) \
            if self.w_offload else None
        # program index -> key of the W set to bring back when the loop reaches it (the W's preceding compute)
        self._prefetch = w_offload.prefetch_points(self.actions, plan.num_microbatches) if self.w_offload else {}
        self.reducers = None
        if (self.g.dp_group is not None and self.local.overlap_dp and not self.fsdp and not self.zero1
                and not split):
            from hetauto.runtime.tensor_parallel import OverlappedGradReducer

            self.reducers = [OverlappedGradReducer(c, self.g.dp_group, op="sum", reduce_dtype=self.mp.reduce_dtype)
                             for c in chunks]

    def _build_transfers(self) -> None:
        """Each boundary's transfer plans (both directions, the interleaved wrap), the compiled program and each
        virtual stage's routes; the stage that reports the loss."""
        plan, cfg, me, p = self.plan, self.cfg, self.me, self.plan.num_stages
        shape = (plan.microbatch_size, plan.seq_len, cfg.hidden)
        methods = plan.boundary_methods()
        lay = self.g.layouts
        self.fwd: list[TransferPlan] = [plan_transfer(lay[h], lay[h + 1], shape, methods[h]) for h in range(len(lay) - 1)]
        self.bwd: list[TransferPlan] = [plan_transfer(lay[h + 1], lay[h], shape, methods[h]) for h in range(len(lay) - 1)]
        # interleaved wrap (stage p-1 chunk c -> stage 0 chunk c+1) takes the last boundary's method, as the cost model
        self.placement = placement = schedule_placement(plan.schedule.name)
        wrap = self.v > 1 and placement == "loop"
        wrap_f = plan_transfer(lay[-1], lay[0], shape, methods[-1]) if wrap else None
        wrap_b = plan_transfer(lay[0], lay[-1], shape, methods[-1]) if wrap else None
        self.tag_stride = max([t.num_tags for t in self.fwd + self.bwd + [w for w in (wrap_f, wrap_b) if w]], default=1)
        last_b: dict[int, int] = {}  # virtual stage -> index of its last backward in the step
        for i, a in enumerate(self.actions):
            if a.type is A.B:
                last_b[a.stage] = i
        last_b_at = set(last_b.values())
        self._program = tuple(_compile(a, i in last_b_at, me.stage, p) for i, a in enumerate(self.actions))
        self._routes = self._resolve_routes(wrap_f, wrap_b)
        # the rank holding the last virtual stage reports the loss (stage p-1; stage 0 under ZB-V's V)
        self.loss_stage = slot_of(self.n_virtual - 1, p, placement)[0]
        if placement == "v" and cfg.tie_embeddings:
            raise PlanMismatch(f"schedule 'zb-v' puts the embedding and the head on stage 0 (the V), but model "
                               f"'{cfg.name}' ties them, which the executor sums only across two stages; use zb-h1")

    def _build_data(self) -> None:
        """The batch source (first and last stage only read data) and the evaluation program: the action list's
        forward half (every stage's F and its transfers, in schedule order; with no backward to wait for, forward
        dependencies alone order it, so it cannot deadlock)."""
        self._data = None
        if self.me.is_first or self.me.is_last:
            from hetauto.runtime.batches import BatchSource

            d = self.data_cfg
            self._data = BatchSource(self.training.seed, self.cfg.vocab_size, d.path, d.held_out_fraction, d.column)
            if self.island.active:
                from hetauto.runtime.batches import island_batches

                self._data = island_batches(self._data, self.island)
        keep = {_RECV_F, _F, _SEND_F}
        self._eval_program = tuple(a for a in self._program if a[0] in keep)
        self.normaliser = self.plan.global_batch * self.plan.seq_len

    def _init_records(self) -> None:
        """What the run reports: per-step values, and the lead rank's timeline (when recording)."""
        self._rec = bool(self.local.record and self.me.is_lead)
        self.eval_losses: list[list[float]] = []  # [step, this rank's share of the held-out loss]
        self.lrs: list[float] = []
        self.grad_norms: list[float] = []
        self.nonfinite_steps: list[int] = []
        self.skipped_checkpoints: list[list[Any]] = []
        self.t0 = 0.0
        self.events: list[list[Any]] = []
        kinds = ("F", "B", "I", "W", "OPTIM") if self.split else ("F", "B", "OPTIM")
        self.cpu: dict[str, list[float]] = {k: [] for k in kinds} if self._rec else {}
        self.dev_s: dict[str, list[float]] = {k: [] for k in kinds} if self._rec else {}
        self._timers: list[tuple[str, Any]] = []  # this step's (kind, device timer) of recorded compute
        self._handlers: dict[int, Callable[[_StepState, int, bool, int, int], None]] = {
            _RECV_F: self._recv_f, _RECV_B: self._recv_b, _F: self._forward, _SEND_F: self._send_f,
            _B: self._backward, _SEND_B: self._send_b, _REDUCE: self._reduce, _OPTIM: self._optim,
            _I: self._input_backward, _W: self._weight_backward,
        }

    # ------------------------------------------------------------------ helpers
    def _resolve_routes(self, wrap_f: TransferPlan | None, wrap_b: TransferPlan | None) -> dict[int, tuple[Any, ...]]:
        """Per virtual stage of this rank: its (forward in, forward out, gradient in, gradient out) routes, resolved
        once (None where there is none). Loop placement: a stage receives activations from stage r-1 (mod p) and
        sends them to r+1 (mod p), every chunk alike; groups.transports[h] carries boundary h -> h+1, the wrap's is
        the last one (boundary_pairs). ZB-V: chunk 0 runs down the stages as above, chunk 1 back up (activations
        from r+1, to r-1, over the boundary's backward transport and plan), and the middle hand-off between the
        last stage's two chunks is local (LocalRoute)."""
        p, st, tr = self.plan.num_stages, self.me.stage, self.g.transports
        edges: dict[tuple[int, int], BoundaryRoute] = {}

        def edge(a: int, b: int) -> BoundaryRoute | None:
            """The route from neighbouring stage a to b, one per direction."""
            if not (0 <= a < p and 0 <= b < p):
                return None
            if (a, b) not in edges:
                h = min(a, b)
                edges[(a, b)] = (self._route(self.fwd[h], tr[h].forward) if b == a + 1
                                 else self._route(self.bwd[h], tr[h].backward))
            return edges[(a, b)]

        if self.placement == "v":
            local = LocalRoute()
            down = (edge(st - 1, st), edge(st, st + 1) or local, edge(st + 1, st) or local, edge(st, st - 1))
            up = (edge(st + 1, st) or local, edge(st, st - 1), edge(st - 1, st), edge(st, st + 1) or local)
            return {st: down, 2 * p - 1 - st: up}
        route = self._route
        fin = edge(st - 1, st) if st > 0 else route(wrap_f, tr[-1].forward) if wrap_f else None
        bout = edge(st, st - 1) if st > 0 else route(wrap_b, tr[-1].backward) if wrap_b else None
        fout = edge(st, st + 1) if st < p - 1 else route(wrap_f, tr[-1].forward) if wrap_f else None
        bin_ = edge(st + 1, st) if st < p - 1 else route(wrap_b, tr[-1].backward) if wrap_b else None
        return {c * p + st: (fin, fout, bin_, bout) for c in range(self.v)}

    def _route(self, tplan: TransferPlan, transport: Any) -> BoundaryRoute:
        return BoundaryRoute(transport, tplan, local_groups=self.g.tp_comms, timeout_s=self.training.timeout_s,
                             dtype=self.mp.boundary_dtype, device=self.device)

    def _tag(self, boundary: int, mb: int, backward: bool) -> int:
        return ((boundary * self.plan.num_microbatches + mb) * 2 + int(backward)) * self.tag_stride

    def _compute(self, fn: Any, *args: Any) -> Any:
        return self.throttle.run(fn, *args) if self.throttle is not None else fn(*args)

    def _timed(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run compute `fn`; when recording, count its thread CPU time and time it on the device."""
        if not self._rec:
            return self._compute(fn, *args)
        timer = self.dev.backend.timer()
        c0 = time.thread_time()
        timer.start()
        out = self._compute(fn, *args)
        timer.stop()
        self.cpu[kind][-1] += time.thread_time() - c0
        self._timers.append((kind, timer))
        return out

    def _record(self, step: int, kind: str, mb: int | None, start: float, end: float | None = None,
                vs: int | None = None) -> None:
        """[step, stage, kind, mb, start_s, end_s], plus the virtual stage as a 7th field when interleaved
        (hetauto.job.results resolves the links by it; plain plans keep the 6-field events)."""
        ev = [step, self.me.stage, kind, mb, start - self.t0, (time.time() if end is None else end) - self.t0]
        if self.v > 1:
            ev.append(self.me.stage if vs is None else vs)
        self.events.append(ev)

    def _forget_old_steps(self, step: int) -> None:
        """Keep the records of the newest RECORDED_STEPS steps only (trimmed every RECORDED_STEPS steps: the cost
        of a step stays constant and small)."""
        if step % RECORDED_STEPS:
            return
        for per_step in (*self.cpu.values(), *self.dev_s.values()):
            del per_step[:-(RECORDED_STEPS - 1) or None]
        first = step - RECORDED_STEPS + 1
        if self.events and self.events[0][0] < first:
            self.events = [e for e in self.events if e[0] >= first]

    def _poll(self, step: int, watch: list[list[Any]]) -> None:
        """Recording only: stamp each watched transfer the first time this rank sees it complete (between actions)."""
        now = time.time()
        keep = []
        for kind, mb, posted, vs in watch:
            if posted.done():
                self._record(step, kind, mb, now, now, vs)
            else:
                keep.append([kind, mb, posted, vs])
        watch[:] = keep

    def _waited(self, st: _StepState, kind: str, k: int, vs: int, posted: Any) -> None:
        """Recording: the wait for `posted` ended now; its own completion stamp is no longer needed."""
        if self._rec:
            self._record(st.step, kind, k, st.t, vs=vs)
            st.watch[:] = [w for w in st.watch if w[2] is not posted]
            st.t = time.time()

    # ------------------------------------------------------------------ one iteration
    def step(self, step: int) -> float:
        """Run the action list once; return this rank's loss contribution (0 on non-last stages)."""
        plan, me = self.plan, self.me
        p, m = plan.num_stages, plan.num_microbatches
        rec = self._rec
        batch = self._data.train(step, plan.global_batch, plan.seq_len) if self._data is not None else None
        st = _StepState(step, batch)
        if rec:
            self._forget_old_steps(step)
            for per_step in (*self.cpu.values(), *self.dev_s.values()):
                per_step.append(0.0)
            self._timers = []
        handlers, prefetch = self._handlers, self._prefetch
        for i, (code, k, last_b, vs, c) in enumerate(self._program):
            if rec:
                if st.watch:
                    self._poll(step, st.watch)
                st.t = time.time()
            if prefetch and i in prefetch:
                self.offload.prefetch(prefetch[i])
            handlers[code](st, vs * m + k if k is not None else -1, last_b, vs, c)
        if self.offload is not None:
            self.offload.finish()
        self._wait_sends(step, st.sends, st.watch)
        if st.recv_f or st.recv_b or st.outputs or st.deferred:
            raise RuntimeError(f"rank {me.rank}: schedule left work behind (recv_f {sorted(st.recv_f)}, "
                               f"recv_b {sorted(st.recv_b)}, outputs {sorted(st.outputs)}, "
                               f"weight steps {sorted(st.deferred)}) in {p}-stage plan")
        if rec:
            for kind, timer in self._timers:
                self.dev_s[kind][-1] += timer.elapsed_s()
        return float(st.loss)

    def evaluate(self, batches: int) -> float:
        """The held-out loss (this rank's share: 0 off the last stage): the forward half of the action list over
        `batches` held-out global batches, without gradients, averaged over them. Every rank calls it."""
        plan, m = self.plan, self.plan.num_microbatches
        rec, self._rec = self._rec, False  # evaluation is not part of the training step's timeline
        total = 0.0
        try:
            for i in range(batches):
                batch = self._data.held_out(i, plan.global_batch, plan.seq_len) if self._data is not None else None
                st = _StepState(-(i + 1), batch)
                with torch.no_grad():
                    for code, k, last_b, vs, c in self._eval_program:
                        self._handlers[code](st, vs * m + k, last_b, vs, c)
                    self._wait_sends(st.step, st.sends, st.watch)
                for key, posted in st.held.items():
                    self._routes[key // m][0].release(posted)
                total += float(st.loss)
        finally:
            self._rec = rec
        return total / batches

    def _recv_f(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        k = key % self.plan.num_microbatches
        st.recv_f[key] = posted = self._routes[vs][0].post_recv(self._tag(vs - 1, k, False))
        if self._rec:
            st.watch.append(["RECVD_F", k, posted, vs])

    def _recv_b(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        k = key % self.plan.num_microbatches
        st.recv_b[key] = posted = self._routes[vs][2].post_recv(self._tag(vs, k, True))
        if self._rec:
            st.watch.append(["RECVD_B", k, posted, vs])

    def _forward(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        k = key % self.plan.num_microbatches
        me, mbs, dp = self.me, self.plan.microbatch_size, self.me.stage_plan.dp
        shares = me.stage_plan.dp_shares  # uneven rows per replica (None: mbs / dp each)
        if vs == 0:
            x = dp_shard(microbatch(st.batch, k, mbs), me.dp_index, dp, shares).tokens.to(self.device)
        else:
            posted = st.held[key] = st.recv_f.pop(key)
            x = self.mp.from_wire(posted.wait().detach()).requires_grad_()
            self._waited(st, "WAIT_F", k, vs, posted)
        st.inputs[key] = x
        with self.mp.autocast():
            if vs == self.n_virtual - 1:
                tgt = dp_shard(microbatch(st.batch, k, mbs), me.dp_index, dp, shares).targets.to(self.device)
                y = self._timed("F", self.chunks[c], x, tgt, self.normaliser)
                st.loss = st.loss + y.detach().float()
            else:
                y = self._timed("F", self.chunks[c], x)
        st.outputs[key] = y
        if self._rec:
            self._record(st.step, "F", k, st.t, vs=vs)

    def _send_f(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        k = key % self.plan.num_microbatches
        posted = self._routes[vs][1].post_send(self.mp.to_wire(st.outputs[key].detach()), self._tag(vs, k, False))
        st.sends.append(posted)
        if self._rec:
            self._record(st.step, "SEND_F", k, st.t, vs=vs)
            st.watch.append(["SENT_F", k, posted, vs])

    def _output_grad(self, st: _StepState, key: int, vs: int) -> tuple[torch.Tensor, Any, Any]:
        """(stage output, the gradient to backprop into it (None: the loss's own), its posted receive)."""
        k = key % self.plan.num_microbatches
        grad = None
        posted = None
        y = st.outputs.pop(key)
        if vs != self.n_virtual - 1:
            posted = st.recv_b.pop(key)
            grad = posted.wait()
            if grad.dtype != y.dtype:  # a 16-bit boundary gradient for the fp32 output
                grad = grad.to(y.dtype)
            self._waited(st, "WAIT_B", k, vs, posted)
        elif self.scaler is not None:  # fp16: backprop the scaled loss
            grad = torch.full_like(y, self.scaler.scale)
        return y, grad, posted

    def _release_after_backward(self, st: _StepState, key: int, posted: Any, gx_ptr: int | None) -> None:
        """The gradient receive's buffer (unless autograd handed it on as the input gradient being sent) and the
        forward input's: nothing reads them once the whole backward of `key` is done."""
        fin, _, bin_, _ = self._routes[key // self.plan.num_microbatches]
        if posted is not None and (gx_ptr is None or posted.buf is None or gx_ptr != posted.buf.data_ptr()):
            bin_.release(posted)
        if key in st.held:
            fin.release(st.held.pop(key))

    def _backward(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        k = key % self.plan.num_microbatches
        y, grad, posted = self._output_grad(st, key, vs)
        if last_b and self.reducers is not None:
            self.reducers[c].arm()
        self._timed("B", torch.autograd.backward, y, grad)
        gx = st.inputs[key].grad if key in st.inputs else None
        self._release_after_backward(st, key, posted, None if gx is None else gx.data_ptr())
        if self._rec:
            self._record(st.step, "B", k, st.t, vs=vs)
        if vs == 0:
            st.inputs.pop(key)

    def _input_backward(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        """I: the input gradient (x.grad, for the SEND_B that follows) and every gradient but the Linears' weights',
        the graph freed; what W needs kept (hetauto.runtime.split_backward). The first virtual stage has no input
        gradient: its I only hands the output on to W (as torch's stage does)."""
        k = key % self.plan.num_microbatches
        y, grad, posted = self._output_grad(st, key, vs)
        gx_ptr = None
        if vs != 0:
            lean = self.lean[c]
            assert lean is not None  # installed on every chunk but the first virtual stage's
            kept = self._timed("I", lean.input_grads, y, grad)
            if self.offload is not None:
                self.offload.send(key, kept)
                kept = w_offload.SENT
            x = st.inputs[key]
            gx_ptr = x.grad.data_ptr() if x.grad is not None else None
            st.deferred[key] = (None, None, posted, kept, gx_ptr)
        else:
            st.deferred[key] = (y, grad, posted, None, gx_ptr)
        if self._rec:
            self._record(st.step, "I", k, st.t, vs=vs)

    def _weight_backward(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        """W: the weight gradients of `key`, accumulated into .grad as the whole backward would. The receive
        buffers are released only now: the kept output gradient of the stage's last Linear may be the received
        gradient itself."""
        k = key % self.plan.num_microbatches
        y, grad, posted, kept, gx_ptr = st.deferred.pop(key)
        if kept is None:
            self._timed("W", torch.autograd.backward, y, grad)
        else:
            if kept is w_offload.SENT:
                kept = self.offload.take(key)
            self._timed("W", split_backward.LeanW.weight_grads, kept)
        self._release_after_backward(st, key, posted, gx_ptr)
        if self._rec:
            self._record(st.step, "W", k, st.t, vs=vs)
        if vs == 0:
            st.inputs.pop(key)

    def _send_b(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        k = key % self.plan.num_microbatches
        gx = self.mp.to_wire(st.inputs.pop(key).grad)
        posted = self._routes[vs][3].post_send(gx, self._tag(vs - 1, k, True))
        st.sends.append(posted)
        if self._rec:
            self._record(st.step, "SEND_B", k, st.t, vs=vs)
            st.watch.append(["SENT_B", k, posted, vs])

    def _reduce(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        self._reduce_grads(c)
        if self._rec:
            self._record(st.step, "REDUCE_GRAD", None, st.t, vs=vs)

    def _optim(self, st: _StepState, key: int, last_b: bool, vs: int, c: int) -> None:
        self._wait_sends(st.step, st.sends, st.watch)
        st.sends = []
        overflow = False
        # what the optimizer steps: the stage's parameters, or (zero1) this rank's owned pieces of them, whose
        # gradients alone hold the DP sum; the overflow vote is over every rank, so DP ranks skip together
        stepped = ([pc for part in self.partitions for pc in part.pieces] if self.zero1
                   else list(self.stage.parameters()))
        if self.scaler is not None:
            overflow = self.scaler.unscale_and_check(stepped, self._vote)
            self.scaler.update(overflow)
        if self._nonfinite(st, stepped, overflow):
            overflow = True  # "skip": this step leaves the weights (and AdamW's state) as they were
        if self.training.clip_grad is not None and not overflow:
            norm = self._global_grad_norm()
            self.grad_norms.append(norm)
            coef = clip_coefficient(norm, self.training.clip_grad)
            if coef < 1.0:
                for prm in stepped:
                    if prm.grad is not None:
                        prm.grad.mul_(coef)
        lr = self.schedule.lr_at(st.step)
        self.lrs.append(lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if not overflow:
            self._timed("OPTIM", self._step_optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        if self.zero1:
            self.stage.zero_grad(set_to_none=True)
        if self._rec:
            self._record(st.step, "OPTIM", None, st.t)

    def _nonfinite(self, st: _StepState, stepped: list[Any], overflow: bool) -> bool:
        """Vote (every rank, one all-reduce) on whether this step's loss or gradients are nan/inf; "stop" raises
        the same NonFiniteTraining on every rank, "skip" returns True (the optimizer step is skipped), "continue"
        only records the step. fp16's loss
        scaler already skipped a step whose gradients overflowed: only its loss counts then."""
        from hetauto.runtime.nonfinite import NonFinite, describe, local_verdict

        last = self.me.stage == self.loss_stage
        loss = float(st.loss) if last else None
        grads = () if overflow else (p.grad for p in stepped)
        mine = torch.tensor(local_verdict(loss, grads), dtype=torch.float32)
        both = self.g.world.all_reduce(mine, op="max")
        verdict = NonFinite(st.step, int(both[0].item()), int(both[1].item()))
        if not verdict.bad:
            return False
        self.nonfinite_steps.append(st.step)
        if self.training.on_nonfinite == "stop":
            from hetauto.core.errors import NonFiniteTraining

            raise NonFiniteTraining(f"{describe(verdict)}; stopped before the optimizer step, so the weights and every "
                                    "checkpoint stay finite (--on-nonfinite stop); lower --lr or add --clip-grad, or "
                                    "pass --on-nonfinite skip to skip such steps")
        return self.training.on_nonfinite == "skip"  # "continue": counted and reported, stepped anyway

    def _fsdp_tp_mesh(self) -> Any:
        """This stage's 2-D (dp, tp) mesh over the DP group and the TP mesh's own group (hetauto.runtime.fsdp)."""
        from hetauto.runtime.fsdp import stage_mesh

        lay = self.me.layout
        ranks = [[lay.rank(d, t) for t in range(lay.tp)] for d in range(lay.dp)]
        return stage_mesh(self.g.dp_group, self.g.tp_mesh.get_group(), ranks, self.device.type)

    def _step_optimizer(self) -> None:
        """AdamW's step; with zero1 then the all-gather of every rank's updated pieces (per chunk)."""
        self.optimizer.step()
        for part in self.partitions:
            part.all_gather_params()

    def _global_grad_norm(self) -> float:
        """The L2 norm of the whole model's gradient, every parameter counted once: DP replicas hold equal
        gradients after REDUCE_GRAD (dp index 0 counts), TP ranks hold distinct shards of sharded parameters
        and copies of the replicated ones (tp index 0 counts those), and the tied table's head-side copy holds
        the same summed gradient as the embedding's (stage 0 counts it). Under FSDP every DP rank holds its
        own shard of every gradient: all count (a TP-replicated one on tp index 0 only, `_tp_sharded`); under zero1
        every DP rank its owned pieces."""
        me = self.me
        total = 0.0
        if self.zero1:
            skip = self.stage.tied_embedding_weight() if me.stage != 0 else None
            grads = []
            for part in self.partitions:
                for pc, (i, _, _) in zip(part.pieces, part.ranges):
                    prm = part.params[i]
                    if pc.grad is None or prm is skip or (not _tp_sharded(prm) and me.tp_index != 0):
                        continue
                    grads.append(pc.grad)
            total = local_sq_norm(grads)
        elif me.dp_index == 0 or self.fsdp:
            skip = self.stage.tied_embedding_weight() if me.stage != 0 else None
            grads = []
            for prm in self.stage.parameters():
                g = prm.grad
                if g is None or prm is skip:
                    continue
                if not _tp_sharded(g) and me.tp_index != 0:
                    continue
                grads.append(g.to_local() if hasattr(g, "to_local") else g)
            total = local_sq_norm(grads)
        t = torch.tensor([total], dtype=torch.float64)
        self.g.world.all_reduce(t)
        return float(t.item()) ** 0.5

    def _vote(self, local: torch.Tensor) -> torch.Tensor:
        """fp16 overflow: the maximum over every rank of the job (world group, host memory)."""
        return self.g.world.all_reduce(local, op="max")

    def _wait_sends(self, step: int, sends: list[Any], watch: list[list[Any]]) -> None:
        for h in sends:
            h.wait()
        if watch:  # recording: a send first seen complete here completed at the latest now
            now = time.time()
            for kind, mb, posted, vs in watch:
                if kind.startswith("SENT"):
                    self._record(step, kind, mb, now, now, vs)
            watch[:] = [w for w in watch if not w[0].startswith("SENT")]

    def _reduce_grads(self, chunk: int = 0) -> None:
        """REDUCE_GRAD of one chunk (the schedule has one per virtual stage): its DP sum, then the tied
        table's sum when this chunk holds the embedding or the head."""
        module = self.chunks[chunk]
        if self.zero1:
            self._reduce_zero1(chunk)
            return
        if self.reducers is not None:
            self.reducers[chunk].finish()
        elif self.g.dp_group is not None and not self.fsdp:  # FSDP reduce-scattered them in backward
            from hetauto.runtime.tensor_parallel import allreduce_gradients

            allreduce_gradients(module, self.g.dp_group, op="sum", reduce_dtype=self.mp.reduce_dtype)
        w = module.tied_embedding_weight()
        if w is not None and self.g.tied_group is not None:
            import torch.distributed as dist

            # over a gloo group in host memory: the first and last stage may sit on different vendors
            contrib = w.grad if (self.me.dp_index == 0 and self.me.tp_index == 0 and w.grad is not None) else None
            buf = contrib.detach().to("cpu", copy=True) if contrib is not None else torch.zeros(w.shape, dtype=w.dtype)
            dist.all_reduce(buf, group=self.g.tied_group)
            w.grad = buf.to(w.device)

    def _reduce_zero1(self, chunk: int) -> None:
        """zero1's REDUCE_GRAD of one chunk: the tied table's sum first, over every DP replica's own gradient
        (each a share of the batch's; dp index 0 then keeps the sum and the others zero, so the DP sum below
        counts it once), then the reduce-scatter of the chunk's flat gradient (hetauto.runtime.zero1)."""
        module = self.chunks[chunk]
        w = module.tied_embedding_weight()
        if w is not None and self.g.tied_group is not None:
            import torch.distributed as dist

            # the other end's stage, if it runs plain DP (dp 1), contributes its reduced gradient from dp index 0
            contrib = w.grad if (self.me.tp_index == 0 and w.grad is not None) else None
            buf = contrib.detach().to("cpu", copy=True) if contrib is not None else torch.zeros(w.shape, dtype=w.dtype)
            dist.all_reduce(buf, group=self.g.tied_group)
            w.grad = buf.to(w.device) if self.me.dp_index == 0 else torch.zeros_like(w)
        self.partitions[chunk].reduce_scatter_grads()

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_optimizer(self, *, gather: bool) -> torch.optim.Optimizer:
        """The optimizer a checkpoint saves or loads, over `self.stage`'s parameters: the executor's own, or with
        zero1 a whole-stage AdamW (`gather=True`: the DP group's shards gathered into it, collective; False:
        empty, for `load_checkpoint` to fill and `adopt_checkpoint_optimizer` to slice). A zero1 checkpoint is
        so in plain DP's layout: it resumes at any dp and any sharding level. fsdp needs no gather: its own
        optimizer's DTensor shards save and load as TP shards do (hetauto.runtime.fsdp)."""
        if not self.zero1:
            return self.optimizer
        full = optimizer_for(self.stage.parameters(), self.training)
        for group in full.param_groups:
            group["lr"] = self.optimizer.param_groups[0]["lr"]
        if gather:
            for part in self.partitions:
                part.gather_state(self.optimizer, full)
        return full

    def adopt_checkpoint_optimizer(self, full: torch.optim.Optimizer) -> None:
        """After `load_checkpoint` into `checkpoint_optimizer(gather=False)`: zero1 keeps its own slice of it."""
        if full is self.optimizer:
            return
        for part in self.partitions:
            part.scatter_state(full, self.optimizer)
        self.stage.zero_grad(set_to_none=True)  # DCP's optimizer-state init left zero gradients behind

    def run(self, steps: int, *, start: int = 0, after_step: Callable[[int], str | None] | None = None) -> RankReport:
        """Train steps `start..steps-1` (step indices are global: a resumed run continues the numbering, so
        its batches are the uninterrupted run's). Before each step the installed fault
        (hetauto.runtime.faults) may fire; after it `after_step(step)` runs (checkpointing) and what it
        returns (a checkpoint directory or None) is listed in the report. Step times come from the
        backend's timer, so queued device work is counted."""
        from hetauto.runtime import faults

        world = self.g.world
        t0 = torch.tensor([time.time()], dtype=torch.float64)
        world.broadcast(t0, 0)  # one clock origin for every rank's timeline (same host: same wall clock)
        self.t0 = float(t0.item())
        before = world.sent_bytes()  # the communicator counts for its whole life; report this run's share
        losses: list[float] = []
        step_s: list[float] = []
        written: list[str] = []
        for i in range(start, steps):
            faults.maybe_fail(i)
            timer = self.dev.backend.timer()
            timer.start()
            losses.append(self.step(i))
            timer.stop()
            step_s.append(timer.elapsed_s())
            held_out = None
            every = self.data_cfg.eval_every
            if every and ((i + 1) % every == 0 or i == steps - 1):
                held_out = self.evaluate(self.data_cfg.eval_steps)
                self.eval_losses.append([i, held_out])
            if self.local.step_log is not None:
                from hetauto.runtime.step_log import step_line

                self.local.step_log(step_line(i, losses[-1], self.lrs[-1] if self.lrs else None,
                                             self.grad_norms[-1] if self.grad_norms else None, step_s[-1], held_out))
            if after_step is not None:
                path = after_step(i)
                if path is not None:
                    written.append(str(path))
        world.barrier()
        me = self.me
        report_loss = me.stage == self.loss_stage and me.tp_index == 0
        return RankReport(
            rank=me.rank, stage=me.stage, dp_index=me.dp_index, tp_index=me.tp_index,
            losses=losses if report_loss else None, step_s=step_s,
            sent_bytes={f"{a}->{b}": n - before.get((a, b), 0) for (a, b), n in sorted(world.sent_bytes().items())
                        if n > before.get((a, b), 0)},
            events=self.events, compute_cpu_s=self.cpu, compute_device_s=self.dev_s,
            throttled_s=self.throttle.slept_s if self.throttle is not None else 0.0,
            start_step=start, checkpoints=written if me.rank == 0 else [],
            backend=self.dev.name, device=self.dev.describe(), dist_backend=self.dev.dist_backend,
            precision=self.mp.name, peak_memory_bytes=self.dev.peak_memory_bytes(),
            transports=[t.name for t in self.g.transports],
            overflow_steps=self.scaler.skipped if self.scaler is not None else 0,
            nonfinite_steps=list(self.nonfinite_steps), skipped_checkpoints=list(self.skipped_checkpoints),
            lrs=list(self.lrs), grad_norms=list(self.grad_norms), eval_losses=list(self.eval_losses),
            optimizer_state_bytes=state_bytes(self.optimizer),
        )


def run_rank(world: Communicator, plan: Plan, cfg: ModelConfig, run: RunConfig,
             local: RankLocal = RankLocal()) -> RankReport:
    """Build this rank's groups and stage, train `run.training.steps` steps, return what it measured.
    Every rank of the job calls it (group creation is collective)."""
    from hetauto.runtime.rank import prepare_rank

    groups, device, precision = prepare_rank(world, plan, cfg, run)
    return StageExecutor(groups, plan, cfg, run, device, precision, local).run(run.training.steps)
