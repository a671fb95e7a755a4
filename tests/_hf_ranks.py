"""The rank function the Hugging Face weight tests run on 4 gloo processes: one training step of a plan started
from a local checkpoint folder (`--init-from`), optionally writing a checkpoint (for the export round trips)."""

from __future__ import annotations

from pathlib import Path

from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan


def train_one_step_from(rank: int, world: int, plan_json: str, folder: str, ckdir: str | None, seed: int) -> dict:
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.training import train_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        cfg = get_model(Path(folder) / "config.json")
        return train_rank(comm, Plan.from_json(plan_json), cfg,
                          RunConfig.from_flat(steps=1, seed=seed, timeout_s=30, init_from=folder,
                                              checkpoint_dir=ckdir)).to_dict()
    finally:
        comm.destroy()
