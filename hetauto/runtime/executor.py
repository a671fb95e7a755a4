"""The per-rank interpreter: run a plan's schedule action lists for real on torch.distributed.

Every rank of a stage runs that stage's action list (hetauto.schedule.schedule_for_plan):
  RECV_F/RECV_B  post the receives of a boundary transfer (hetauto.runtime.resharding.start_transfer)
                 early; the compute that needs them waits just before it runs;
  F / B          forward / backward of the stage's module (DTensor TP inside the stage), throttled to
                 the device's speed factor when emulating;
  SEND_F/SEND_B  post the sends asynchronously (waited at the end of the step, before OPTIM);
  REDUCE_GRAD    DP gradient SUM (bucketed; overlapped with the step's last backward when dp > 1),
                 then the tied-embedding sum between first and last stage when the model ties;
  OPTIM          AdamW (hetauto.runtime.reference.make_optimizer).
Messages are tagged per (boundary, microbatch, direction), so the order in which the two sides post
them does not matter. The loss follows hetauto.runtime.reference: each last-stage dp shard backprops
sum-CE / (global_batch * seq_len), gradients are summed.

Interleaved 1F1B (v > 1 chunks per stage): a rank builds one module per chunk (slots from
hetauto.core.chunks.chunk_layers, initialised from (seed, slot) like every stage, so the chain of virtual
stages is the single-process model), runs its action list keyed by virtual stage (`c * p + r`), and
tags boundary k = virtual stage k -> k+1. A stage receives from stage r-1 and sends to stage r+1 (mod p):
the wrap from stage p-1's chunk c to stage 0's chunk c+1 is one more transfer plan (last boundary's
resharding method, as the cost model prices it). Each chunk's REDUCE_GRAD sums that chunk's gradients
over dp (its own overlapped reducer, armed before that chunk's last backward); one AdamW and one
checkpoint module (ChunkedStage: slots by global name) cover all chunks.

The interpreter reports plain JSON-able values (`RankReport.to_dict`), so `hetauto run` can collect
them from files and tests from `run_ranks`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from hetauto.core.chunks import chunk_layers, effective_chunks
from hetauto.core.comm import Communicator
from hetauto.core.errors import PlanMismatch
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan
from hetauto.runtime.data import dp_shard, microbatch, synthetic_batch
from hetauto.runtime.groups import RankGroups, build_groups
from hetauto.runtime.reference import make_optimizer
from hetauto.runtime.boundary import BoundaryRoute
from hetauto.runtime.executable import check_executable
from hetauto.runtime.resharding import TransferPlan, plan_transfer
from hetauto.runtime.stage import ChunkedStage, StageModule, build_stage
from hetauto.runtime.throttle import Throttle
from hetauto.schedule.actions import Action, ActionType
from hetauto.schedule.for_plan import schedule_for_plan

__all__ = ["ExecutorOptions", "RankReport", "StageExecutor", "run_rank", "check_executable"]

A = ActionType


@dataclass(frozen=True, slots=True)
class ExecutorOptions:
    steps: int = 3
    seed: int = 0
    lr: float = 1e-3
    timeout_s: float = 60.0
    speed_factor: float = 1.0  # < 1 emulates a slower device (Throttle)
    overlap_dp: bool = True  # DP all-reduce overlapped with the last backward
    record: bool = True  # keep the lead rank's timeline


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
    events: list[list[Any]] = field(default_factory=list)  # [step, stage, kind, mb, start_s, end_s]
    # lead ranks: per step, the thread CPU seconds of the F, B and OPTIM actions (the work without waits, throttle
    # sleeps or time-slicing: wall / CPU is what the rest of the host cost this stage)
    compute_cpu_s: dict[str, list[float]] = field(default_factory=dict)
    throttled_s: float = 0.0
    start_step: int = 0  # the first step this run trained (> 0 when resumed from a checkpoint)
    checkpoints: list[str] = field(default_factory=list)  # directories written by this run (rank 0 only)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_RECV_F, _RECV_B, _F, _SEND_F, _B, _SEND_B, _REDUCE, _OPTIM = range(8)
_CODES = {A.RECV_F: _RECV_F, A.RECV_B: _RECV_B, A.F: _F, A.SEND_F: _SEND_F, A.B: _B, A.SEND_B: _SEND_B,
          A.REDUCE_GRAD: _REDUCE, A.OPTIM: _OPTIM}


def _compile(a: Action, last_b: bool, stage: int, p: int) -> tuple[int, int, bool, int, int]:
    """(opcode, microbatch, is its virtual stage's last backward of the step, virtual stage, chunk): the
    action list as the interpreter loop reads it."""
    code = _CODES.get(a.type)
    if code is None:
        raise PlanMismatch(f"stage {stage}: the executor cannot run action {a} (type {a.type.value})")
    return code, a.microbatch, last_b, a.stage, a.stage // p


class StageExecutor:
    """One rank's stage module, optimizer, transfer plans and action list; `step(i)` runs one iteration."""

    def __init__(self, groups: RankGroups, plan: Plan, cfg: ModelConfig, options: ExecutorOptions) -> None:
        check_executable(plan)
        self.g, self.plan, self.cfg, self.opt_ = groups, plan, cfg, options
        me = groups.me
        s = plan.stages[me.stage]
        self.me = me
        p = plan.num_stages
        # interleaved: v chunks per stage, virtual stage c*p + r = chunk c of stage r (hetauto.core.chunks)
        self.v = v = effective_chunks(plan.schedule.name, plan.schedule.virtual_chunks)
        self.n_virtual = p * v
        chunks = [build_stage(cfg, rng, options.seed, s.recompute) for rng in chunk_layers(plan)[me.stage]]
        if groups.tp_mesh is not None or groups.dp_group is not None:
            # imported here: DTensor's import costs ~0.7 s per process, and a tp = dp = 1 rank needs none of it
            from hetauto.runtime.tensor_parallel import OverlappedGradReducer, parallelize_stage

            chunks = [parallelize_stage(c, groups.tp_mesh) for c in chunks]
        self.chunks: tuple[StageModule, ...] = tuple(chunks)
        # one module for the optimizer and checkpoints: the stage itself, or all its chunks by global slot name
        self.stage: StageModule | ChunkedStage = chunks[0] if v == 1 else ChunkedStage(chunks)
        self.optimizer = make_optimizer(self.stage.parameters(), options.lr)
        self.actions: tuple[Action, ...] = schedule_for_plan(plan).ranks[me.stage]
        self.throttle = Throttle(options.speed_factor) if options.speed_factor != 1.0 else None
        # one reducer per chunk, armed before that chunk's last backward of the step
        self.reducers = (
            [OverlappedGradReducer(c, groups.dp_group, op="sum") for c in chunks]
            if groups.dp_group is not None and options.overlap_dp else None
        )
        shape = (plan.microbatch_size, plan.seq_len, cfg.hidden)
        methods = plan.boundary_methods()
        lay = groups.layouts
        self.fwd: list[TransferPlan] = [plan_transfer(lay[h], lay[h + 1], shape, methods[h]) for h in range(len(lay) - 1)]
        self.bwd: list[TransferPlan] = [plan_transfer(lay[h + 1], lay[h], shape, methods[h]) for h in range(len(lay) - 1)]
        # interleaved wrap (stage p-1 chunk c -> stage 0 chunk c+1) takes the last boundary's method, as the cost model
        wrap_f = plan_transfer(lay[-1], lay[0], shape, methods[-1]) if v > 1 else None
        wrap_b = plan_transfer(lay[0], lay[-1], shape, methods[-1]) if v > 1 else None
        self.tag_stride = max([t.num_tags for t in self.fwd + self.bwd + [w for w in (wrap_f, wrap_b) if w]], default=1)
        last_b: dict[int, int] = {}  # virtual stage -> index of its last backward in the step
        for i, a in enumerate(self.actions):
            if a.type is A.B:
                last_b[a.stage] = i
        last_b_at = set(last_b.values())
        self._program = tuple(_compile(a, i in last_b_at, me.stage, p) for i, a in enumerate(self.actions))
        # this rank's side of its two boundaries in each direction, resolved once (None where there is none);
        # a stage always receives activations from stage r-1 (mod p) and sends them to stage r+1 (mod p)
        st, route = me.stage, self._route
        last = len(lay) - 1
        self._fwd_in = route(self.fwd[st - 1]) if st > 0 else route(wrap_f) if wrap_f else None
        self._bwd_out = route(self.bwd[st - 1]) if st > 0 else route(wrap_b) if wrap_b else None
        self._fwd_out = route(self.fwd[st]) if st < last else route(wrap_f) if wrap_f else None
        self._bwd_in = route(self.bwd[st]) if st < last else route(wrap_b) if wrap_b else None
        self._rec = bool(options.record and me.is_lead)
        self.normaliser = plan.global_batch * plan.seq_len
        self.t0 = 0.0
        self.events: list[list[Any]] = []
        self.cpu: dict[str, list[float]] = {"F": [], "B": [], "OPTIM": []} if self._rec else {}

    # ------------------------------------------------------------------ helpers
    def _route(self, tplan: TransferPlan) -> BoundaryRoute:
        return BoundaryRoute(self.g.world, tplan, local_groups=self.g.tp_comms, timeout_s=self.opt_.timeout_s)

    def _tag(self, boundary: int, mb: int, backward: bool) -> int:
        return ((boundary * self.plan.num_microbatches + mb) * 2 + int(backward)) * self.tag_stride

    def _compute(self, fn: Any, *args: Any) -> Any:
        return self.throttle.run(fn, *args) if self.throttle is not None else fn(*args)

    def _add_cpu(self, kind: str, since: float) -> None:
        """Recording: this step's thread CPU seconds of `kind` actions grow by the time since `since`."""
        self.cpu[kind][-1] += time.thread_time() - since

    def _record(self, step: int, kind: str, mb: int | None, start: float, end: float | None = None,
                vs: int | None = None) -> None:
        """[step, stage, kind, mb, start_s, end_s], plus the virtual stage as a 7th field when interleaved
        (hetauto.runtime.results resolves the links by it; plain plans keep the 6-field events)."""
        ev = [step, self.me.stage, kind, mb, start - self.t0, (time.time() if end is None else end) - self.t0]
        if self.v > 1:
            ev.append(self.me.stage if vs is None else vs)
        self.events.append(ev)

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

    # ------------------------------------------------------------------ one iteration
    def step(self, step: int) -> float:
        """Run the action list once; return this rank's loss contribution (0 on non-last stages).

        State is keyed by (virtual stage, microbatch) (`vs * m + k`): with interleaving one rank holds the
        same microbatch in several chunks at once. Boundary k (virtual stage k -> k+1) tags its messages."""
        plan, me, chunks = self.plan, self.me, self.chunks
        p, m, n = plan.num_stages, plan.num_microbatches, self.n_virtual
        rec = self._rec
        need_data = me.stage == 0 or me.stage == p - 1
        batch = synthetic_batch(self.opt_.seed, step, plan.global_batch, plan.seq_len, self.cfg.vocab_size) if need_data else None
        dp = plan.stages[me.stage].dp
        mbs = plan.microbatch_size
        fwd_in, bwd_in = self._fwd_in, self._bwd_in
        fwd_out, bwd_out = self._fwd_out, self._bwd_out
        reducers = self.reducers
        tag = self._tag
        recv_f: dict[int, Any] = {}
        recv_b: dict[int, Any] = {}
        inputs: dict[int, torch.Tensor] = {}
        held: dict[int, Any] = {}  # forward-input receives whose buffer autograd still reads
        outputs: dict[int, torch.Tensor] = {}
        sends: list[Any] = []
        watch: list[list[Any]] = []  # recording: transfers not yet seen complete
        loss_sum = 0.0
        t = c0 = 0.0
        if rec:
            for per_step in self.cpu.values():
                per_step.append(0.0)
        for a in self._program:
            code, k, last_b, vs, c = a
            key = vs * m + k if k is not None else -1
            if rec:
                if watch:
                    self._poll(step, watch)
                t = time.time()
            if code == _RECV_F:
                recv_f[key] = posted = fwd_in.post_recv(tag(vs - 1, k, False))
                if rec:
                    watch.append(["RECVD_F", k, posted, vs])
            elif code == _RECV_B:
                recv_b[key] = posted = bwd_in.post_recv(tag(vs, k, True))
                if rec:
                    watch.append(["RECVD_B", k, posted, vs])
            elif code == _F:
                if vs == 0:
                    x = dp_shard(microbatch(batch, k, mbs), me.dp_index, dp).tokens
                else:
                    posted = held[key] = recv_f.pop(key)
                    x = posted.wait().detach().requires_grad_()
                    if rec:
                        self._record(step, "WAIT_F", k, t, vs=vs)
                        watch[:] = [w for w in watch if w[2] is not posted]  # WAIT_F's end bounds it now
                        t = time.time()
                inputs[key] = x
                if rec:
                    c0 = time.thread_time()
                if vs == n - 1:
                    tgt = dp_shard(microbatch(batch, k, mbs), me.dp_index, dp).targets
                    y = self._compute(chunks[c], x, tgt, self.normaliser)
                    loss_sum += float(y.detach())
                else:
                    y = self._compute(chunks[c], x)
                outputs[key] = y
                if rec:
                    self._add_cpu("F", c0)
                    self._record(step, "F", k, t, vs=vs)
            elif code == _SEND_F:
                posted = fwd_out.post_send(outputs[key].detach(), tag(vs, k, False))
                sends.append(posted)
                if rec:
                    self._record(step, "SEND_F", k, t, vs=vs)
                    watch.append(["SENT_F", k, posted, vs])
            elif code == _B:
                grad = None
                posted = None
                if vs != n - 1:
                    posted = recv_b.pop(key)
                    grad = posted.wait()
                    if rec:
                        self._record(step, "WAIT_B", k, t, vs=vs)
                        watch[:] = [w for w in watch if w[2] is not posted]
                        t = time.time()
                if last_b and reducers is not None:
                    reducers[c].arm()
                y = outputs.pop(key)
                if rec:
                    c0 = time.thread_time()
                self._compute(torch.autograd.backward, y, grad)
                if rec:
                    self._add_cpu("B", c0)
                if posted is not None:
                    gx = inputs[key].grad if key in inputs else None
                    if gx is None or gx.data_ptr() != posted.buf.data_ptr():  # autograd may hand the buffer on
                        bwd_in.release(posted)
                if key in held:
                    fwd_in.release(held.pop(key))  # backward is done: nothing reads the input buffer any more
                if rec:
                    self._record(step, "B", k, t, vs=vs)
                if vs == 0:
                    inputs.pop(key)
            elif code == _SEND_B:
                gx = inputs.pop(key).grad
                posted = bwd_out.post_send(gx, tag(vs - 1, k, True))
                sends.append(posted)
                if rec:
                    self._record(step, "SEND_B", k, t, vs=vs)
                    watch.append(["SENT_B", k, posted, vs])
            elif code == _REDUCE:
                self._reduce_grads(c)
                if rec:
                    self._record(step, "REDUCE_GRAD", None, t, vs=vs)
            elif code == _OPTIM:
                self._wait_sends(step, sends, watch)
                sends = []
                if rec:
                    c0 = time.thread_time()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                if rec:
                    self._add_cpu("OPTIM", c0)
                    self._record(step, "OPTIM", None, t)
        self._wait_sends(step, sends, watch)
        if recv_f or recv_b or outputs:
            raise RuntimeError(f"rank {me.rank}: schedule left work behind (recv_f {sorted(recv_f)}, "
                               f"recv_b {sorted(recv_b)}, outputs {sorted(outputs)}) in {p}-stage plan")
        return loss_sum

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
        if self.reducers is not None:
            self.reducers[chunk].finish()
        elif self.g.dp_group is not None:
            from hetauto.runtime.tensor_parallel import allreduce_gradients

            allreduce_gradients(module, self.g.dp_group, op="sum")
        w = module.tied_embedding_weight()
        if w is not None and self.g.tied_group is not None:
            import torch.distributed as dist

            contrib = w.grad if (self.me.dp_index == 0 and self.me.tp_index == 0 and w.grad is not None) else None
            buf = contrib.clone() if contrib is not None else torch.zeros_like(w)
            dist.all_reduce(buf, group=self.g.tied_group)
            w.grad = buf

    def run(self, steps: int, *, start: int = 0, after_step: Callable[[int], str | None] | None = None) -> RankReport:
        """Train steps `start..steps-1` (step indices are global: a resumed run continues the numbering, so
        its batches are the uninterrupted run's). Before each step the installed fault
        (hetauto.runtime.faults) may fire; after it `after_step(step)` runs (checkpointing) and what it
        returns (a checkpoint directory or None) is listed in the report."""
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
            t = time.perf_counter()
            losses.append(self.step(i))
            step_s.append(time.perf_counter() - t)
            if after_step is not None:
                path = after_step(i)
                if path is not None:
                    written.append(str(path))
        world.barrier()
        me = self.me
        report_loss = me.stage == self.plan.num_stages - 1 and me.tp_index == 0
        return RankReport(
            rank=me.rank, stage=me.stage, dp_index=me.dp_index, tp_index=me.tp_index,
            losses=losses if report_loss else None, step_s=step_s,
            sent_bytes={f"{a}->{b}": n - before.get((a, b), 0) for (a, b), n in sorted(world.sent_bytes().items())
                        if n > before.get((a, b), 0)},
            events=self.events, compute_cpu_s=self.cpu, throttled_s=self.throttle.slept_s if self.throttle is not None else 0.0,
            start_step=start, checkpoints=written if me.rank == 0 else [],
        )


def run_rank(world: Communicator, plan: Plan, cfg: ModelConfig, options: ExecutorOptions) -> RankReport:
    """Build this rank's groups and stage, train `options.steps` steps, return what it measured.
    Every rank of the job calls it (group creation is collective)."""
    torch.manual_seed(options.seed)
    groups = build_groups(world, plan, tied=cfg.tie_embeddings)
    return StageExecutor(groups, plan, cfg, options).run(options.steps)
