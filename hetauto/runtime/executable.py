"""What the executor cannot run, checked before anything is launched (no torch import).

Why its own module: `hetauto run` rejects such a plan before starting torchrun; importing the executor
(torch, several seconds) just for this check would delay every launch.
"""

from __future__ import annotations

from hetauto.core.chunks import ChunkError, chunk_layers, effective_chunks
from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan

__all__ = ["check_executable"]


def check_executable(plan: Plan) -> None:
    """What this executor cannot run, as a one-line PlanMismatch before anything starts.

    Interleaved 1F1B runs every stage's chunks (hetauto.core.chunks.chunk_layers) and needs: at least two
    stages (one stage would hand activations to itself: use 1f1b), microbatches a multiple of the stages
    (Megatron's grouping, hetauto.schedule.generators.interleaved), and at least v layers per stage."""
    if plan.schedule.name != "interleaved":
        return
    v = effective_chunks(plan.schedule.name, plan.schedule.virtual_chunks)
    p, m = plan.num_stages, plan.num_microbatches
    if p < 2:
        raise PlanMismatch("schedule 'interleaved' needs at least 2 stages (a single stage's chunks would only "
                           "hand activations to itself); use schedule 1f1b for a one-stage plan")
    if m % p:
        raise PlanMismatch(f"schedule 'interleaved' needs num_microbatches (m={m}) to be a multiple of the "
                           f"stages (p={p}); choose microbatch_size so that m is a multiple of {p}")
    try:
        chunk_layers(plan)
    except ChunkError as exc:
        raise PlanMismatch(f"schedule 'interleaved' with {v} chunks per stage: {exc}") from None
