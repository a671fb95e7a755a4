"""A stage builder model that ties its head to its embedding (issue 30): across stages each rank would build its
own copy and train them untied, silently off the single-process model, so such a plan is refused before launch
naming the parameter, the slots and their stages; within one stage it runs. And the last line of defence: a run
whose loss leaves the reference's tolerance fails naming the step and the difference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetauto.job.result import loss_off_reference
from hetauto.core.errors import PlanMismatch
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.user_model import check_ties, shared_parameters

TIED = '''import torch
from torch import nn


class Head(nn.Module):
    def __init__(self, emb: nn.Embedding) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.weight = emb.weight  # tied: the embedding's own Parameter

    def forward(self, x):
        return self.norm(x) @ self.weight.t()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class TiedTiny:
    vocab_size, hidden, num_blocks, max_seq_len = 64, 16, 2, 16

    def __init__(self) -> None:
        self._emb = None

    def embedding(self):
        self._emb = nn.Embedding(64, 16)
        return self._emb

    def block(self, i):
        return Block()

    def head(self):
        return Head(self._emb if self._emb is not None else self.embedding())
'''
CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: b, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""
REF = "tiedmodel:TiedTiny"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "tiedmodel.py").write_text(TIED)
    (tmp_path / "two.yaml").write_text(CLUSTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HETAUTO_MODEL_CODE", "tiedmodel")
    return tmp_path


def _plan(*cuts: tuple[str, tuple[int, int]]) -> Plan:
    return Plan(model=REF, cluster="two.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
                stages=tuple(StagePlan(cluster=c, device_type="cpu", devices=(0,), layers=l, tp=1, dp=1)
                             for c, l in cuts))


def test_a_tie_across_stages_is_refused_and_within_one_stage_allowed(folder: Path) -> None:
    cfg = get_model(REF)
    assert shared_parameters(REF) == [("weight", 0, 3)]
    with pytest.raises(PlanMismatch) as err:
        check_ties(_plan(("a", (0, 2)), ("b", (2, 4))), cfg)
    assert str(err.value) == (f"{REF} ties parameter 'weight' of layer slot 3 to layer slot 0, but the plan puts them "
                              "in stages 0 and 1: each stage builds its own copy, so they would train untied; plan "
                              "them into one stage, or untie them in the model")
    check_ties(_plan(("a", (0, 4))), cfg)
    # an untied model's slots share nothing (its freed modules' ids are not mistaken for ties)
    monkey = pytest.MonkeyPatch()
    monkey.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    monkey.setenv("HETAUTO_MODEL_CODE", "examples.causal_mixer")
    try:
        assert shared_parameters("examples.causal_mixer:CausalMixer") == []
    finally:
        monkey.undo()


def test_the_tied_table_is_priced_once(folder: Path) -> None:
    """The head's slot holds the embedding's Parameter: its elements, gradients and optimizer states live once on
    the stage holding both, so the head counts only its own norm (the matmul still casts the table: counted)."""
    from hetauto.planner.layers import layers_from_builder

    emb, *_, head = layers_from_builder(REF, 16)
    assert (emb.params, emb.param_tensors) == (64 * 16, 1)
    assert (head.params, head.param_tensors, head.shares_with) == (2 * 16, 2, 0)
    assert head.matmul_params == 64 * 16


def test_hetauto_run_refuses_the_untied_plan_before_launch(folder: Path) -> None:
    _plan(("a", (0, 2)), ("b", (2, 4))).save(folder / "plan.json")
    proc = subprocess.run([sys.executable, "-m", "hetauto.cli", "run", "plan.json", "--model-code", "tiedmodel",
                           "--json"], capture_output=True, text=True, timeout=120, cwd=folder,
                          env={k: v for k, v in os.environ.items() if k != "HETAUTO_MODEL_CODE"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["error"].startswith(f"{REF} ties parameter 'weight' of layer slot 3 to layer slot 0")


def test_the_planner_never_splits_the_tie(folder: Path) -> None:
    """The planner prices a plan that splits the tie as one that cannot run (hetauto evaluate says why), so on two
    clusters, where it used to cut the model in two stages, it plans one the run accepts."""
    from hetauto.api import plan as make_plan
    from hetauto.planner.evaluate import Evaluator, inputs_for_plan

    split = _plan(("a", (0, 2)), ("b", (2, 4))).model_copy(update={"cluster": str(folder / "two.yaml")})
    ev = Evaluator(inputs_for_plan(split)).evaluate(split)
    assert not ev.feasible and ev.violation == (
        f"{REF} ties layer slot 3 to layer slot 0 (a shared parameter), but the plan puts them in stages 0 and 1: "
        "they would train untied; only plans holding both in one stage run")
    chosen = make_plan(scenario="cpu-demo", model=REF, seq_len=16, global_batch=128).plan
    check_ties(chosen, get_model(REF))  # raises on a split tie, as hetauto run would before launch
    assert chosen.num_stages == 1


def test_a_loss_off_the_reference_names_the_step_and_the_difference() -> None:
    ref = [8.322363, 8.1, 7.9]
    assert loss_off_reference([8.322363, 8.1, 7.9], ref, 0, 1e-5) is None
    assert loss_off_reference([8.322363 + 5e-6, 8.1, float("nan")], ref, 0, 1e-5) is None  # nan: --on-nonfinite's
    assert loss_off_reference([8.322363, 8.1, 7.92], ref, 4, 1e-5) == (
        "step 6: loss 7.920000 is 0.020000 from the single-process reference 7.900000, beyond the tolerance 7.9e-05: "
        "the pipeline does not train the model the reference does (weights tied across stages? other data?); "
        "--no-reference skips the comparison")
    assert loss_off_reference([1.0], None, 0, 1e-5) is None
