"""Every check of an island run before anything starts (`prepare_islands`): `hetauto run ISLAND_PLAN.json` and
`hetauto.run()` with an island plan (`"schema": "hetauto.plan/2"`, hetauto.core.islands).

Why its own preparation: an island plan is several ordinary plans, each run as a job of its own (its own torchrun,
control store and run folder; hetauto.job.island_launch), so each island is checked as `hetauto run` checks a
plan, with its name in the error; and what island runs do not support yet (traces, TensorBoard scalars) is
refused here in one line each, before any island starts, rather than found inside one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetauto.core.errors import HetautoError
from hetauto.job.request import JobRequest

if TYPE_CHECKING:
    from hetauto.core.islands import IslandPlan
    from hetauto.core.plan import Plan
    from hetauto.core.run_config import RunConfig

__all__ = ["IslandRun", "PreparedIsland", "PreparedIslands", "prepare_islands",
           "unsupported_option", "with_absolute_cluster"]


@dataclass(frozen=True)
class PreparedIsland:
    """One island as a job of its own: its name and index in the island plan, its plan/1 plan, and the run
    configuration its ranks read (its `island` section is set at launch, with the outer store's port; the fault of
    `--inject-fault` only in the island whose rank it names)."""

    name: str
    index: int
    plan: Plan
    options: RunConfig


@dataclass(frozen=True)
class PreparedIslands:
    """A checked island run: the request (seed resolved), the island plan and its file, the cluster spec and model
    config every island shares, the plan's folder, and the islands."""

    request: JobRequest
    plan: IslandPlan
    path: Path
    cluster: Any
    cfg: Any
    base: Path
    islands: tuple[PreparedIsland, ...]
    start_step: int = 0  # a resumed run's first step (every island's)

    @property
    def options(self) -> RunConfig:
        """The run configuration every island shares (training, data, seed): island 0's, without its fault."""
        return replace(self.islands[0].options, faults=replace(self.islands[0].options.faults, inject=None))


@dataclass(frozen=True)
class IslandRun:
    """One island as launched: its run configuration (emulated backends, the island section) and what the host's
    preflight changed (`emulated`: the stages moved to the emulation backend), and the environment of its job."""

    island: PreparedIsland
    options: RunConfig
    emulated: tuple[dict[str, Any], ...]
    env: dict[str, str]


def with_absolute_cluster(plan: IslandPlan, base: Path) -> IslandPlan:
    """`plan` with its cluster file, when it is one relative to `base`, made absolute in the plan and in every
    island (they name the same one): a copy saved elsewhere (the job's folder, a temporary folder) still finds it."""
    ref = plan.cluster
    if not ref or not (base / ref).is_file():
        return plan
    path = str((base / ref).resolve())
    islands = tuple(i.model_copy(update={"plan": i.plan.model_copy(update={"cluster": path})})
                    if i.plan.cluster == ref else i for i in plan.islands)
    return plan.model_copy(update={"cluster": path, "islands": islands})


def unsupported_option(r: JobRequest) -> str | None:
    """The first option an island run does not support yet, as one line (None: every option given is supported).
    Why each: a trace and TensorBoard scalars are one plan's timeline and one step series. (--max-restarts is
    supported: the launcher starts a lost island again and the others take it back, hetauto.job.island_launch;
    --emulate netns is supported: each island runs as a namespace job, hetauto.job.island_netns.)"""
    f = r.flag
    for name, given, why in (
            ("trace", r.trace is not None, "island runs do not write a Chrome trace yet"),
            ("tensorboard", r.tensorboard is not None,
             f"island runs do not write TensorBoard scalars yet ({f('log_jsonl')} rows carry each step's island)")):
        if given:
            return f"{why}; drop {f(name)}"
    return None


def prepare_islands(request: JobRequest) -> PreparedIslands:
    """Check an island run's options, plan (every island as `hetauto run` checks a plan), fault and data before
    anything starts."""
    from hetauto.core.islands import IslandPlan
    from hetauto.core.plan_check import validate_island_plan
    from hetauto.job.prepare import check_inputs, check_plan_runs, check_request_options

    check_request_options(request)
    unsupported = unsupported_option(request)
    if unsupported is not None:
        raise HetautoError(unsupported)
    path = Path(request.plan).resolve()
    plan = IslandPlan.load(request.plan)
    base = path.parent
    cluster, cfg = validate_island_plan(plan, base)
    for i, isl in enumerate(plan.islands):
        try:
            check_plan_runs(isl.plan, cfg, base, request)
        except HetautoError as err:
            raise _in_island(err, i, isl.name) from None
    fault = _island_fault(request, plan)
    if request.checkpoint_dir is not None:
        from hetauto.job.checkpoint_checks import check_checkpoint_dir

        check_checkpoint_dir(request.checkpoint_dir, request.flag)
    start, resume = 0, [None] * len(plan.islands)
    if request.resume is not None:
        request, start, resume = _check_island_resume(request, plan, cfg)
    if request.seed is None:
        request = request.with_knobs(seed=0)
    check_inputs(request, plan, cfg)  # the islands read rows of one data stream at the plan's global batch
    islands = tuple(_prepared_island(request, plan, i, cluster, base, fault, resume[i])
                    for i in range(len(plan.islands)))
    return PreparedIslands(request.with_knobs(inject_fault=None), plan, path, cluster, cfg, base, islands, start)


def _check_island_resume(r: JobRequest, plan: IslandPlan, cfg: Any) -> tuple[JobRequest, int, list[str | None]]:
    """--resume of an island run: every island's checkpoint of the same step, each checked as `hetauto run` checks
    one (intact, this model, steps left) and holding this island plan's outer state; the checkpoint's seed unless
    --seed agrees. Returns the request with the seed resolved, the first step, each island's step folder."""
    from hetauto.core.checkpoint_manifest import read_manifest
    from hetauto.core.errors import CheckpointMismatch
    from hetauto.job.checkpoint_checks import check_checkpoint_tensors, check_resume, island_resume_points
    from hetauto.runtime.checkpoint_outer import outer_mismatch

    assert r.resume is not None
    folders = island_resume_points(r.resume, [isl.name for isl in plan.islands], r.flag, r.warn)
    start, seed = 0, None
    for i, (isl, folder) in enumerate(zip(plan.islands, folders)):
        try:
            why = outer_mismatch(read_manifest(folder).extra, plan, i)
            if why is not None:
                raise CheckpointMismatch(f"{r.flag('resume')} {folder}: {why}")
            start, seed = check_resume(str(folder), cfg, r.steps, isl.plan, allow_data_change=r.allow_data_change,
                                       flag=r.flag, warn=r.warn, island=True)
            check_checkpoint_tensors(str(folder), cfg)
        except HetautoError as err:
            raise _in_island(err, i, isl.name) from None
    if r.seed is not None and seed is not None and r.seed != seed:
        raise HetautoError(f"{r.flag('seed')} {r.seed} differs from the checkpoint's data seed {seed}; "
                           f"drop {r.flag('seed')} to continue the checkpoint's run")
    return r.with_knobs(seed=seed if r.seed is None else r.seed), start, [str(f) for f in folders]


def _in_island(err: HetautoError, index: int, name: str) -> HetautoError:
    """`err` as one line naming the island, with its exit code."""
    out = HetautoError(f"islands[{index}] ({name}): {err}")
    out.exit_code = err.exit_code
    return out


def _island_fault(r: JobRequest, plan: IslandPlan) -> tuple[int, str] | None:
    """--inject-fault's rank counts the island plan's ranks in island order (island 0's ranks first, then island
    1's, ...): (the island it falls in, the spec with the island's own rank), checked as `hetauto run` checks it."""
    if r.inject_fault is None:
        return None
    from hetauto.runtime.faults import FaultSpec

    spec = FaultSpec.parse(r.inject_fault)
    name, total = r.flag("inject_fault"), sum(isl.plan.world_size for isl in plan.islands)
    if spec.rank >= total:
        raise HetautoError(f"{name}: rank {spec.rank} is outside the island plan's {total} ranks (island 0's ranks "
                           "first, then island 1's, ...)")
    if spec.phase != "step" and r.checkpoint_dir is None:
        raise HetautoError(f"{name}: phase={spec.phase} fires while a checkpoint is written, and this island run "
                           f"writes none; add {r.flag('checkpoint_dir')} or use phase=step")
    last = r.steps - 1 if spec.phase == "step" else r.steps  # checkpoint k is written after step k-1
    if spec.step > last:
        raise HetautoError(f"{name}: step {spec.step} never comes (the run's last {spec.phase} is {last} with "
                           f"{r.flag('steps')} {r.steps}); name an earlier step or raise {r.flag('steps')}")
    rank = spec.rank
    for i, isl in enumerate(plan.islands):
        if rank < isl.plan.world_size:
            return i, str(replace(spec, rank=rank))
        rank -= isl.plan.world_size
    raise AssertionError("unreachable: the rank was checked against the total")


def _prepared_island(r: JobRequest, plan: IslandPlan, index: int, cluster: Any, base: Path,
                     fault: tuple[int, str] | None, resume: str | None) -> PreparedIsland:
    """Island `index`'s run configuration: the request's (as `hetauto run` builds it for the island's plan), its
    checkpoints in its own folder under --checkpoint-dir, `resume` its step folder, the fault only where it
    fires."""
    from hetauto.job.checkpoint_checks import island_folder
    from hetauto.job.options import run_options

    isl = plan.islands[index]
    folder = None if r.checkpoint_dir is None else str(island_folder(r.checkpoint_dir, isl.name))
    options = run_options(r.with_knobs(inject_fault=None, checkpoint_dir=folder, resume=resume), isl.plan, cluster,
                          base)
    if fault is not None and fault[0] == index:
        options = replace(options, faults=replace(options.faults, inject=fault[1]))
    return PreparedIsland(isl.name, index, isl.plan, options)
