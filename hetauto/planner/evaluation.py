"""What pricing a plan answers, as values: its `Evaluation`, a stage's `StageTimes`, a boundary's `BoundaryLink`
and the `TimeBreakdown`; and how a plan's precision resolves (`plan_precision`).

Why a module of its own: the evaluator's sections (hetauto.planner.evaluate and the modules it composes) and the
modules that only read results (hetauto.planner.correction, the commands) share these without importing the
evaluator itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetauto.core.cluster import ClusterSpec
from hetauto.core.errors import InfeasiblePlan, PlanMismatch
from hetauto.core.headroom import usable_bytes
from hetauto.core.plan import Plan, Prediction
from hetauto.core.precision import DeviceKind, backend_kind, resolve_precision
from hetauto.core.stage_backends import stage_backend_names
from hetauto.planner.linkmodel import LinkReading

__all__ = ["BoundaryLink", "Evaluation", "StageTimes", "TimeBreakdown", "device_kind", "plan_precision"]


@dataclass(frozen=True, slots=True)
class Evaluation:
    feasible: bool
    iteration_time_s: float
    throughput_samples_s: float
    tokens_s: float
    bubble_fraction: float
    mfu: float
    tflops_per_device: float
    peak_memory_bytes: tuple[float, ...]
    memory_capacity_bytes: tuple[float, ...]
    violation: str | None = None
    memory_headroom: float = 0.0  # the share of each device's memory the plan kept free (the plan's own)

    @property
    def memory_available_bytes(self) -> tuple[float, ...]:
        """Per stage, what its device may use: its memory less the headroom."""
        return tuple(usable_bytes(c, self.memory_headroom) for c in self.memory_capacity_bytes)

    def to_prediction(self, cost_model: str = "analytical") -> Prediction:
        """What a plan file records of a feasible evaluation (an infeasible one has no finite time to record)."""
        if not self.feasible:
            raise InfeasiblePlan(f"an infeasible plan has no prediction to record: {self.violation}")
        return Prediction(iteration_time_s=self.iteration_time_s, throughput_samples_s=self.throughput_samples_s,
                          tokens_s=self.tokens_s, bubble_fraction=self.bubble_fraction,
                          peak_memory_bytes=self.peak_memory_bytes, mfu=self.mfu, cost_model=cost_model)


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One stage's share of an iteration (see `Evaluator.breakdown`): per microbatch `forward_s`/`backward_s`
    (what the pipeline sees), per iteration the rest. `source`: where the compute figures come from,
    "analytical" (peak x efficiency) or "measured" (the device profile's measured layer rows,
    hetauto.planner.measured; their TP collectives are inside the measured times, so `tp_comm_s` holds only
    the calibrated executor's TP terms)."""

    forward_s: float
    backward_s: float
    compute_s: float
    tp_comm_s: float
    dp_allreduce_s: float
    optimizer_s: float
    source: str = "analytical"

    @property
    def busy_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.dp_allreduce_s + self.optimizer_s


@dataclass(frozen=True, slots=True)
class BoundaryLink:
    """How boundary `boundary` (stage h -> h+1) was priced (hetauto.planner.linkmodel): its link's `kind`
    ("cross-cluster", "inter-node", "intra-node"), `source` ("measured", "model", "nominal"), `detail` (the
    term that bounds a flow), one microbatch's `flows` x `flow_bytes` and their `seconds` one way; a
    cross-cluster one's `reading` (linkmodel.read_link: what its figure is per, the aggregate it gave)."""

    boundary: int
    kind: str
    source: str
    detail: str
    flows: int
    flow_bytes: float
    seconds: float
    reading: LinkReading | None = None

    def as_dict(self) -> dict[str, object]:
        return {"boundary": self.boundary, "kind": self.kind, "source": self.source, "detail": self.detail,
                "flows": self.flows, "flow_bytes": self.flow_bytes, "seconds": self.seconds,
                **(self.reading.as_dict() if self.reading is not None else {})}


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    """`Evaluator.breakdown(plan)`: the critical stage's compute, TP, exposed DP all-reduce and optimizer, the
    pipeline's P2P/resharding and bubble; the six sum to `iteration_time_s` (inf: an infeasible plan)."""

    iteration_time_s: float
    critical_stage: int
    compute_s: float
    tp_comm_s: float
    dp_allreduce_s: float
    p2p_resharding_s: float
    bubble_s: float
    optimizer_s: float
    stages: tuple[StageTimes, ...]
    evaluation: Evaluation
    links: tuple[BoundaryLink, ...] = ()  # how each boundary's link was priced (which source)

    def as_dict(self) -> dict[str, float]:
        return {"compute_s": self.compute_s, "tp_comm_s": self.tp_comm_s, "dp_allreduce_s": self.dp_allreduce_s,
                "p2p_resharding_s": self.p2p_resharding_s, "bubble_s": self.bubble_s,
                "optimizer_s": self.optimizer_s}


def device_kind(backend: str) -> DeviceKind:
    """What precision resolution knows of a stage on `backend` (hetauto.core.precision.backend_kind)."""
    return backend_kind(backend)


def plan_precision(plan: Plan, spec: ClusterSpec) -> str:
    """`plan.training.precision` resolved over its stages' backends (the cluster spec's, never
    $HETAUTO_BACKEND's); a precision a stage cannot run is a PlanMismatch saying which to use."""
    kinds = [device_kind(b) for b in stage_backend_names(plan, spec, environ={})]
    try:
        return resolve_precision(plan.training.precision, kinds)
    except ValueError as err:
        raise PlanMismatch(str(err)) from None
