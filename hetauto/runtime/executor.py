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

The interpreter reports plain JSON-able values (`RankReport.to_dict`), so `hetauto run` can collect
them from files and tests from `run_ranks`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from hetauto.core.comm import Communicator
from hetauto.core.errors import PlanMismatch
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan
from hetauto.runtime.data import dp_shard, microbatch, synthetic_batch
from hetauto.runtime.groups import RankGroups, build_groups
from hetauto.runtime.reference import make_optimizer
from hetauto.runtime.resharding import TransferPlan, plan_transfer, start_transfer
from hetauto.runtime.stage import StageModule, build_stage
from hetauto.runtime.tensor_parallel import OverlappedGradReducer, allreduce_gradients, parallelize_stage
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
    throttled_s: float = 0.0
    start_step: int = 0  # the first step this run trained (> 0 when resumed from a checkpoint)
    checkpoints: list[str] = field(default_factory=list)  # directories written by this run (rank 0 only)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_executable(plan: Plan) -> None:
    """What this executor cannot run (yet), as a PlanMismatch before anything starts."""
    if plan.schedule.name == "interleaved" and plan.schedule.virtual_chunks > 1:
        raise PlanMismatch(
            "schedule 'interleaved' with virtual_chunks > 1 is not supported by the executor "
            "(its model chunks are not the plan's contiguous stage ranges); use 1f1b, gpipe or virtual-1f1b"
        )


class StageExecutor:
    """One rank's stage module, optimizer, transfer plans and action list; `step(i)` runs one iteration."""

    def __init__(self, groups: RankGroups, plan: Plan, cfg: ModelConfig, options: ExecutorOptions) -> None:
        check_executable(plan)
        self.g, self.plan, self.cfg, self.opt_ = groups, plan, cfg, options
        me = groups.me
        s = plan.stages[me.stage]
        self.me = me
        self.stage: StageModule = parallelize_stage(
            build_stage(cfg, s.layers, options.seed, s.recompute), groups.tp_mesh
        )
        self.optimizer = make_optimizer(self.stage.parameters(), options.lr)
        self.actions: tuple[Action, ...] = schedule_for_plan(plan).ranks[me.stage]
        self.throttle = Throttle(options.speed_factor) if options.speed_factor != 1.0 else None
        self.reducer = (
            OverlappedGradReducer(self.stage, groups.dp_group, op="sum")
            if groups.dp_group is not None and options.overlap_dp else None
        )
        shape = (plan.microbatch_size, plan.seq_len, cfg.hidden)
        methods = plan.boundary_methods()
        lay = groups.layouts
        self.fwd: list[TransferPlan] = [plan_transfer(lay[h], lay[h + 1], shape, methods[h]) for h in range(len(lay) - 1)]
        self.bwd: list[TransferPlan] = [plan_transfer(lay[h + 1], lay[h], shape, methods[h]) for h in range(len(lay) - 1)]
        self.tag_stride = max([p.num_tags for p in self.fwd + self.bwd], default=1)
        last_b = [i for i, a in enumerate(self.actions) if a.type is A.B]
        self._last_b = last_b[-1] if last_b else -1
        self.normaliser = plan.global_batch * plan.seq_len
        self.t0 = 0.0
        self.events: list[list[Any]] = []

    # ------------------------------------------------------------------ helpers
    def _tag(self, boundary: int, mb: int, backward: bool) -> int:
        return ((boundary * self.plan.num_microbatches + mb) * 2 + int(backward)) * self.tag_stride

    def _start(self, plan: TransferPlan, tensor: torch.Tensor | None, tag: int) -> Any:
        return start_transfer(
            self.g.world, plan, tensor, dtype=torch.float32, local_groups=self.g.tp_comms, tag_base=tag,
            timeout_s=self.opt_.timeout_s,
        )

    def _compute(self, fn: Any, *args: Any) -> Any:
        return self.throttle.run(fn, *args) if self.throttle is not None else fn(*args)

    def _record(self, step: int, kind: str, mb: int | None, start: float) -> None:
        if self.opt_.record and self.me.is_lead:
            self.events.append([step, self.me.stage, kind, mb, start - self.t0, time.time() - self.t0])

    # ------------------------------------------------------------------ one iteration
    def step(self, step: int) -> float:
        """Run the action list once; return this rank's loss contribution (0 on non-last stages)."""
        plan, me, st = self.plan, self.me, self.stage
        p = plan.num_stages
        need_data = st.is_first or st.is_last
        batch = synthetic_batch(self.opt_.seed, step, plan.global_batch, plan.seq_len, self.cfg.vocab_size) if need_data else None
        dp = plan.stages[me.stage].dp
        recv_f: dict[int, Any] = {}
        recv_b: dict[int, Any] = {}
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        sends: list[Any] = []
        loss_sum = 0.0
        for i, a in enumerate(self.actions):
            t = time.time()
            k = a.microbatch
            if a.type is A.RECV_F:
                recv_f[k] = self._start(self.fwd[me.stage - 1], None, self._tag(me.stage - 1, k, False))
            elif a.type is A.RECV_B:
                recv_b[k] = self._start(self.bwd[me.stage], None, self._tag(me.stage, k, True))
            elif a.type is A.F:
                if st.is_first:
                    x = dp_shard(microbatch(batch, k, plan.microbatch_size), me.dp_index, dp).tokens
                else:
                    x = recv_f.pop(k).wait().requires_grad_()
                    self._record(step, "WAIT_F", k, t)
                    t = time.time()
                inputs[k] = x
                if st.is_last:
                    tgt = dp_shard(microbatch(batch, k, plan.microbatch_size), me.dp_index, dp).targets
                    y = self._compute(st, x, tgt, self.normaliser)
                    loss_sum += float(y.detach())
                else:
                    y = self._compute(st, x)
                outputs[k] = y
                self._record(step, "F", k, t)
            elif a.type is A.SEND_F:
                sends.append(self._start(self.fwd[me.stage], outputs[k].detach(), self._tag(me.stage, k, False)))
                self._record(step, "SEND_F", k, t)
            elif a.type is A.B:
                grad = None
                if not st.is_last:
                    grad = recv_b.pop(k).wait()
                    self._record(step, "WAIT_B", k, t)
                    t = time.time()
                if i == self._last_b and self.reducer is not None:
                    self.reducer.arm()
                y = outputs.pop(k)
                self._compute(torch.autograd.backward, y, grad)
                self._record(step, "B", k, t)
                if st.is_first:
                    inputs.pop(k)
            elif a.type is A.SEND_B:
                gx = inputs.pop(k).grad
                sends.append(self._start(self.bwd[me.stage - 1], gx, self._tag(me.stage - 1, k, True)))
                self._record(step, "SEND_B", k, t)
            elif a.type is A.REDUCE_GRAD:
                self._reduce_grads()
                self._record(step, "REDUCE_GRAD", None, t)
            elif a.type is A.OPTIM:
                for h in sends:
                    h.wait()
                sends = []
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self._record(step, "OPTIM", None, t)
            else:
                raise PlanMismatch(f"stage {me.stage}: the executor cannot run action {a} (type {a.type.value})")
        for h in sends:
            h.wait()
        if recv_f or recv_b or outputs:
            raise RuntimeError(f"rank {me.rank}: schedule left work behind (recv_f {sorted(recv_f)}, "
                               f"recv_b {sorted(recv_b)}, outputs {sorted(outputs)}) in {p}-stage plan")
        return loss_sum

    def _reduce_grads(self) -> None:
        if self.reducer is not None:
            self.reducer.finish()
        elif self.g.dp_group is not None:
            allreduce_gradients(self.stage, self.g.dp_group, op="sum")
        w = self.stage.tied_embedding_weight()
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
        report_loss = self.stage.is_last and me.tp_index == 0
        return RankReport(
            rank=me.rank, stage=me.stage, dp_index=me.dp_index, tp_index=me.tp_index,
            losses=losses if report_loss else None, step_s=step_s,
            sent_bytes={f"{a}->{b}": n - before.get((a, b), 0) for (a, b), n in sorted(world.sent_bytes().items())
                        if n > before.get((a, b), 0)},
            events=self.events, throttled_s=self.throttle.slept_s if self.throttle is not None else 0.0,
            start_step=start, checkpoints=written if me.rank == 0 else [],
        )


def run_rank(world: Communicator, plan: Plan, cfg: ModelConfig, options: ExecutorOptions) -> RankReport:
    """Build this rank's groups and stage, train `options.steps` steps, return what it measured.
    Every rank of the job calls it (group creation is collective)."""
    torch.manual_seed(options.seed)
    groups = build_groups(world, plan, tied=cfg.tie_embeddings)
    return StageExecutor(groups, plan, cfg, options).run(options.steps)
