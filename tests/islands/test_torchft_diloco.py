"""Ours against the real peer (issue 40, item 5): torchft's own DiLoCo / Streaming DiLoCo (torchft.local_sgd.DiLoCo,
torchft 0.2.0) with a real Manager, a real lighthouse and torchft's gloo process group, two replica groups in two
threads of this process, next to hetauto's single-process island reference (reference_islands) on the same tiny
model, data rows, AdamW and outer hyperparameters, with equal batches (torchft averages with equal weights).

Tolerance: bit for bit. Both sides run the same inner steps (the same ReferenceTrainer drives torchft's replicas:
DiLoCo hooks its optimizer), the same pseudo-gradient (global - local, fp32), the same torch SGD with Nesterov
momentum, and the only different arithmetic is the average: torchft sums the two replicas (gloo) and divides by 2,
ours takes 0.5 * g0 + 0.5 * g1; scaling by a power of two is exact in binary floating point, so both give the
same bits (no subnormals at these magnitudes). A reassociation would show as ~1e-7 relative; there is none.
"""

from __future__ import annotations

import platform
import sys
import threading
from datetime import timedelta

import pytest
import torch

from hetauto.core.islands import Island, IslandPlan, OuterSync, WireLink
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, StagePlan
from hetauto.core.run_config import RunConfig
from hetauto.runtime.island_reference import island_trainer, reference_islands
from hetauto.runtime.outer_sync import fragment_slots

if not (sys.platform == "linux" and platform.machine() == "x86_64"):
    pytest.skip("torchft 0.2.0 has wheels for Linux x86_64 only", allow_module_level=True)
# torchft is a pinned dev extra there (pyproject.toml): never skipped, a missing install fails here by name
from torch.distributed import TCPStore  # noqa: E402
from torchft._torchft import LighthouseServer  # noqa: E402
from torchft.local_sgd import DiLoCo  # noqa: E402
from torchft.manager import Manager  # noqa: E402
from torchft.process_group import ProcessGroupGloo  # noqa: E402

MODEL, SEQ, BATCH, MICRO = "tiny-gpt", 16, 4, 4
TIMEOUT = timedelta(seconds=60)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _plan(inner_steps: int, fragments: int, overlap: int = 0, alpha: float = 0.0) -> IslandPlan:
    def island(name: str) -> Island:
        stage = StagePlan(cluster=name, device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1)
        return Island(name=name, plan=Plan(model=MODEL, cluster="test", seq_len=SEQ, global_batch=BATCH,
                                           microbatch_size=MICRO, num_microbatches=BATCH // MICRO, stages=(stage,)))

    return IslandPlan(model=MODEL, cluster="test", seq_len=SEQ, global_batch=2 * BATCH,
                      islands=(island("a"), island("b")),
                      outer=OuterSync(inner_steps=inner_steps, fragments=fragments, overlap_steps=overlap,
                                      update_alpha=alpha, wire=(WireLink(between=("a", "b"), format="fp32"),)))


def _torchft_replica(plan: IslandPlan, index: int, run: RunConfig, lighthouse: str, out: dict) -> None:
    """Island `index` as a torchft replica group of one rank: our inner training, torchft's outer loop."""
    cfg = get_model(MODEL)
    trainer = island_trainer(plan, index, cfg, run, "fp32")
    model, outer = trainer.model, plan.outer
    fragments = [torch.nn.ModuleList([model.layers[str(s)] for s in slots])
                 for slots in fragment_slots(cfg.num_layer_slots, outer.fragments)]
    outer_opts = [torch.optim.SGD(f.parameters(), lr=outer.optimizer.lr, momentum=outer.optimizer.momentum,
                                  nesterov=True) for f in fragments]
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)  # the replica group's own store
    manager = Manager(pg=ProcessGroupGloo(timeout=TIMEOUT), min_replica_size=2, load_state_dict=None,
                      state_dict=None, use_async_quorum=False, replica_id=f"island{index}", store_addr="localhost",
                      store_port=store.port, rank=0, world_size=1, lighthouse_addr=lighthouse, hostname="localhost",
                      init_sync=False,  # every island starts from the run's seed: identical weights
                      timeout=TIMEOUT, quorum_timeout=TIMEOUT, connect_timeout=TIMEOUT)
    try:
        with DiLoCo(manager, fragments, trainer.opt, outer_opts, sync_every=outer.inner_steps, pin_memory=False,
                    fragment_sync_delay=outer.overlap_steps, fragment_update_alpha=outer.update_alpha):
            losses = [trainer.train_step(step) for step in range(run.training.steps)]
        out[index] = (tuple(losses), {n: p.detach().clone() for n, p in model.named_parameters()},
                      manager.current_step())
    finally:
        manager.shutdown(wait=False)


def _run_torchft(plan: IslandPlan, run: RunConfig) -> dict:
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=100)
    out: dict = {}
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            _torchft_replica(plan, i, run, lighthouse.address(), out)
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        lighthouse.shutdown()
    if errors:
        raise errors[0]
    assert sorted(out) == [0, 1], "a torchft replica did not finish in 120 s"
    return out


# (H, F, rounds, tau, alpha): plain DiLoCo; Streaming DiLoCo blocking; Streaming DiLoCo with the exchange in flight
# over tau inner steps (torchft's fragment_sync_delay), dropping those steps' local progress (alpha 0) or mixing it
# in (fragment_update_alpha 0.5); plain DiLoCo with tau = H - 1
CASES = [(2, 1, 3, 0, 0.0), (4, 2, 2, 0, 0.0), (4, 2, 2, 1, 0.0), (4, 2, 2, 1, 0.5), (3, 1, 2, 2, 0.0)]


@pytest.mark.parametrize("inner_steps, fragments, rounds, overlap, alpha", CASES,
                         ids=["diloco", "streaming", "streaming-tau1", "streaming-tau1-alpha", "diloco-tau2"])
def test_torchft_diloco_and_ours_agree_bit_for_bit(inner_steps: int, fragments: int, rounds: int, overlap: int,
                                                   alpha: float) -> None:
    plan = _plan(inner_steps, fragments, overlap, alpha)
    run = RunConfig.from_flat(steps=rounds * inner_steps, seed=7, lr=3e-3)
    ours = reference_islands(plan, get_model(MODEL), run)
    theirs = _run_torchft(plan, run)
    assert ours.rounds == rounds * fragments
    for i in range(2):
        losses, params, syncs = theirs[i]
        assert syncs == ours.rounds  # torchft's manager step: one per committed fragment sync
        assert losses == ours.losses[i]
        assert params.keys() <= ours.params[i].keys()
        for name, p in params.items():
            assert torch.equal(p, ours.params[i][name]), name
    moved = [n for n, p in ours.params[0].items() if not torch.equal(p, _initial(n))]
    assert moved, "the run trained nothing: the comparison would be empty"


def _initial(name: str) -> torch.Tensor:
    from hetauto.runtime.stage import build_model

    return dict(build_model(get_model(MODEL), 7).named_parameters(remove_duplicate=False))[name]
