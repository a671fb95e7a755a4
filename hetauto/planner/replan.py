"""Re-planning for a changed cluster: the same job (model, sequence length, global batch) from a checkpoint,
planned for a new cluster. The executor reshards the checkpoint to the new stage/TP/DP layout on load, so
the planner only has to keep the job's identity and may choose any layout.

    inputs, ref = replan_inputs("ckpt/", cluster="two.yaml")
    result = plan(inputs, model_ref=ref)    # then: hetauto run NEW_PLAN --resume ckpt/

The checkpoint module (torch) is imported only here, only when re-planning.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.model_catalog import get_model
from hetauto.planner.inputs import PlanningInputs, load_planning_inputs


@dataclass(frozen=True, slots=True)
class Resumed:
    """What the checkpoint fixes about the job: where it is, its step, model and the old plan's figures."""

    checkpoint: str
    step: int
    model: ModelConfig
    model_ref: str | None  # the old plan's `model` field (a catalog name or a config.json path)
    seq_len: int | None
    global_batch: int | None
    old_plan: dict[str, Any] | None


def read_resumed(checkpoint_dir: str | Path) -> Resumed:
    """The job a checkpoint belongs to (a checkpoint directory, or a root: its latest complete checkpoint)."""
    from hetauto.core.checkpoint_manifest import resolve_checkpoint, read_manifest

    path = resolve_checkpoint(checkpoint_dir)
    man = read_manifest(path)
    cfg = man.model_config()
    old = man.plan if isinstance(man.plan, dict) else None
    seq = old.get("seq_len") if old else None
    gbs = old.get("global_batch") if old else None
    ref = old.get("model") if old and isinstance(old.get("model"), str) else None
    return Resumed(str(path), man.step, cfg, ref, seq if isinstance(seq, int) else None,
                   gbs if isinstance(gbs, int) else None, old)


def check_same_model(resumed: Resumed, model: str | Path | ModelConfig) -> ModelConfig:
    """The requested model if it is the checkpoint's (same structure); CheckpointMismatch naming the
    differing fields otherwise."""
    from hetauto.core.checkpoint_manifest import check_model_config, read_manifest

    cfg = model if isinstance(model, ModelConfig) else get_model(model)
    check_model_config(read_manifest(resumed.checkpoint), cfg, resumed.checkpoint)
    return cfg


def replan_inputs(checkpoint_dir: str | Path, *, cluster: str | Path | None = None, scenario: str | None = None,
                  model: str | Path | None = None, global_batch: int | None = None,
                  seq_len: int | None = None) -> tuple[PlanningInputs, str | None, Resumed]:
    """Planning inputs for the checkpoint's job on a new cluster (a file or a scenario's cluster): the
    checkpoint's model, sequence length and global batch unless overridden; a `model` that is not the
    checkpoint's is rejected (CheckpointMismatch). Returns (inputs, the plan's model reference, resumed)."""
    if cluster is None and scenario is None:
        raise SpecError(None, "--cluster", "--resume re-plans for a new cluster but none was given",
                        "pass --cluster NEW.yaml or --scenario NAME")
    resumed = read_resumed(checkpoint_dir)
    cfg = check_same_model(resumed, model) if model is not None else resumed.model
    seq = seq_len if seq_len is not None else resumed.seq_len
    gbs = global_batch if global_batch is not None else resumed.global_batch
    if seq is None or gbs is None:
        raise SpecError(f"{resumed.checkpoint}/manifest.json", "plan", "the checkpoint records no plan, so its "
                        "sequence length and global batch are unknown", "pass --seq N and --gbs N")
    if scenario is not None and cluster is None:
        from hetauto.core.scenarios import get_scenario

        spec: Any = get_scenario(scenario).cluster
        src = scenario
    else:
        spec, src = cluster, None
    inputs = load_planning_inputs(cluster=spec, model=cfg, global_batch=gbs, seq_len=seq)
    if src is not None:  # the plan names the scenario, so `hetauto run` / `simulate` resolve it
        inputs = PlanningInputs(inputs.cluster, inputs.model, inputs.seq_len, inputs.global_batch, inputs.layers,
                                src, src)
    ref = resumed.model_ref
    if model is not None and not isinstance(model, ModelConfig):
        ref = str(model) if Path(str(model)).is_file() else cfg.name
    elif ref is not None and ref != cfg.name and not Path(ref).is_file():
        ref = None  # an old config.json path that is not here: the catalog name is all we can write
    return inputs, (ref if ref != cfg.name else None), resumed
