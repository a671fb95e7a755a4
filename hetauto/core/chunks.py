"""Which layer slots each stage's model chunks hold under the interleaved 1F1B schedule (no torch import).

Why a rule of its own: the plan IR gives each stage ONE contiguous layer range, but interleaved 1F1B
(Megatron) runs `v` model chunks per stage, virtual stage `c * p + r` being chunk `c` of stage `r`, and the
data flows through the virtual stages in order (from stage p-1's chunk c back to stage 0's chunk c+1). So
the executor needs the slots of every virtual stage, consecutive virtual stages holding consecutive slots,
the embedding in virtual stage 0 and the head in the last one.

The rule keeps what the cost model charges (hetauto.planner.evaluate): each stage holds exactly as many
slots as its `layers` range is long, split as evenly as possible into its v chunks (the first `n % v`
chunks one slot longer), so a planner's interleaved plan runs unchanged with the compute it was priced for
(the cost model prices every virtual stage by these same slots: Evaluator.chunk_costs).
A plan may instead give every stage's `chunks` explicitly (StagePlan.chunks); `tile_chunks` checks them.

Shared with the schedule: `effective_chunks(name, v)` is the chunk count the schedule generator really uses
(`interleaved` always runs at least 2 chunks, as hetauto.schedule.for_plan and the cost model do; `zb-v` 2).

ZB-V (`zb-v`, torch's ScheduleZBVZeroBubble) places its two chunks per stage in a V (`placement` "v"): virtual
stage s is chunk 0 of stage s for s < p and chunk 1 of stage 2p-1-s after, so the model runs down the stages
and back up; the same even split, tiled in that virtual-stage order (the embedding and the head both on stage 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetauto.core.plan import Plan

__all__ = ["ChunkError", "effective_chunks", "schedule_placement", "slot_of", "even_split", "tile_chunks",
           "chunk_layers", "virtual_layers"]

Range = tuple[int, int]


class ChunkError(ValueError):
    """Chunk ranges that do not tile the model; the message names the field (`stages[i].chunks`) and the fix."""


def effective_chunks(schedule_name: str, virtual_chunks: int) -> int:
    """Chunks per stage the schedule actually runs: max(v, 2) for 'interleaved', 2 for 'zb-v', else 1."""
    if schedule_name == "zb-v":
        return 2
    return max(int(virtual_chunks), 2) if schedule_name == "interleaved" else 1


def schedule_placement(schedule_name: str) -> str:
    """How the schedule places virtual stages on stages: "v" for 'zb-v' (hetauto.schedule.actions.owner), else
    "loop" (virtual stage c * p + r on stage r)."""
    return "v" if schedule_name == "zb-v" else "loop"


def slot_of(vs: int, p: int, placement: str = "loop") -> tuple[int, int]:
    """(stage, chunk) of virtual stage `vs`: loop c * p + r -> (r, c); V s -> (s, 0) for s < p, (2p-1-s, 1) after."""
    if placement == "v":
        return (vs, 0) if vs < p else (2 * p - 1 - vs, 1)
    return vs % p, vs // p


def even_split(n: int, v: int) -> tuple[int, ...]:
    """`n` slots into `v` chunk lengths as evenly as possible, longer chunks first (7, 3 -> (3, 2, 2))."""
    return tuple(n // v + (1 if c < n % v else 0) for c in range(v))


def tile_chunks(layers: Sequence[Range], v: int, explicit: Sequence[Sequence[Range] | None] | None = None,
                placement: str = "loop") -> tuple[tuple[Range, ...], ...]:
    """Per stage, the `v` half-open slot ranges of its chunks (chunk order), for stages whose `layers` ranges
    are given in order. Without `explicit` (or all None) the lengths are `even_split(len(layers[r]), v)`,
    placed consecutively in virtual-stage order (c * p + r). With `explicit` every stage must give its
    chunks; they must have v entries each, be non-empty, sum to the stage's layer count, and tile the model
    consecutively in virtual-stage order. Raises ChunkError (a ValueError) naming the field and the fix."""
    p = len(layers)
    counts = [int(b) - int(a) for a, b in layers]
    total = sum(counts)
    start = int(layers[0][0]) if p else 0
    given = [None if e is None else tuple((int(a), int(b)) for a, b in e) for e in (explicit or [None] * p)]
    if any(g is not None for g in given):
        missing = [r for r, g in enumerate(given) if g is None]
        if missing:
            r = missing[0]
            raise ChunkError(f"stages[{r}].chunks: missing while other stages give chunks "
                             f"(give every stage's chunks, or none to split each stage evenly)")
        for r, g in enumerate(given):
            if len(g) != v:
                raise ChunkError(f"stages[{r}].chunks: {len(g)} chunks for {v} virtual chunks per stage "
                                 f"(give exactly {v} [start, end) ranges)")
            for c, (a, b) in enumerate(g):
                if b <= a:
                    raise ChunkError(f"stages[{r}].chunks[{c}]: range [{a}, {b}) is empty "
                                     f"(every chunk needs at least one layer: start < end)")
            n = sum(b - a for a, b in g)
            if n != counts[r]:
                raise ChunkError(f"stages[{r}].chunks: {n} layers in chunks but the stage's layers range holds "
                                 f"{counts[r]} (the chunks must hold exactly the stage's layer count)")
        pos = start
        for c in range(v):
            for r in range(p):
                a, b = given[r][c]
                if a != pos:
                    raise ChunkError(f"stages[{r}].chunks[{c}]: starts at {a}, expected {pos} (virtual stage "
                                     f"{c * p + r} must continue where virtual stage {c * p + r - 1} ends)")
                pos = b
        return tuple(given)  # type: ignore[arg-type]
    lengths = [even_split(n, v) for n in counts]
    out: list[list[Range]] = [[(0, 0)] * v for _ in range(p)]
    pos = start
    for vs in range(p * v):
        r, c = slot_of(vs, p, placement)
        out[r][c] = (pos, pos + lengths[r][c])
        pos += lengths[r][c]
    assert pos == start + total
    return tuple(tuple(o) for o in out)


def chunk_layers(plan: "Plan") -> tuple[tuple[Range, ...], ...]:
    """Per stage, its chunks' slot ranges in chunk order (virtual stage c * p + r = chunk c of stage r).
    Non-interleaved plans: one chunk per stage, its `layers` range. Raises ChunkError when a stage has
    fewer layers than chunks (an empty chunk) or the explicit chunks are invalid."""
    v = effective_chunks(plan.schedule.name, plan.schedule.virtual_chunks)
    if v == 1:
        return tuple((tuple(s.layers),) for s in plan.stages)  # type: ignore[misc]
    out = tile_chunks([s.layers for s in plan.stages], v, [s.chunks for s in plan.stages],
                      schedule_placement(plan.schedule.name))
    for r, chunks in enumerate(out):
        for c, (a, b) in enumerate(chunks):
            if b <= a:
                fix = "or lower schedule.virtual_chunks" if plan.schedule.name == "interleaved" else "or use zb-h1"
                raise ChunkError(f"stages[{r}].layers: {plan.stages[r].num_layers} layer(s) cannot fill {v} "
                                 f"{plan.schedule.name} chunks (give the stage at least {v} layers, {fix})")
    return out


def virtual_layers(plan: "Plan") -> tuple[Range, ...]:
    """The slot range of every virtual stage, in virtual-stage order (index c * p + r; ZB-V's V order)."""
    per = chunk_layers(plan)
    p, v = len(per), len(per[0])
    place = schedule_placement(plan.schedule.name)
    return tuple(per[slot_of(k, p, place)[0]][slot_of(k, p, place)[1]] for k in range(p * v))
