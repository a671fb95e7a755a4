"""Your own model (hetauto.core.user_model): the example causal mixer's layer list is counted from its modules
(parameters and FLOPs in closed form), the planner plans it at tp 1, a 2-stage run (recomputed blocks on the
first stage, dp 2 on the second) and an interleaved run equal the single-process model, and a builder that
breaks the protocol is refused with one line."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from hetauto.core.errors import PlanMismatch, SpecError
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, StagePlan
from hetauto.core.plan_check import check_plan
from hetauto.core.scenarios import get_scenario
from hetauto.core.user_model import is_builder_ref, load_builder
from hetauto.planner.layers import layer_list, total_params
from hetauto.runtime.reference import reference_losses
from hetauto.job.results import summarize
from hetauto.testing.multiproc import run_ranks

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `examples` imports from the repository root
REF = "examples.causal_mixer:CausalMixer"
# importing model code is an explicit choice (--model-code; hetauto.core.user_model): these tests make it
CODE_ENV = {"HETAUTO_MODEL_CODE": "examples.causal_mixer,halfmodel,itemmodel,no_such_module_here"}


@pytest.fixture(autouse=True)
def _model_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETAUTO_MODEL_CODE", CODE_ENV["HETAUTO_MODEL_CODE"])
V, H, F, N, S = 256, 32, 64, 4, 32
SEED, GBS, MBS = 5, 8, 4


def test_the_layer_list_is_counted_from_the_modules() -> None:
    cfg = get_model(REF)
    assert (cfg.name, cfg.arch, cfg.num_layers, cfg.hidden, cfg.vocab_size, cfg.builder) == (REF, "custom", N, H, V, REF)
    layers = layer_list(cfg, S)
    assert [la.kind for la in layers] == ["embedding"] + ["block"] * N + ["head"]
    block = 2 * 2 * H + (S * S + S) + (H * F + F) + (F * H + H)  # two LayerNorms, token mixing, channel MLP
    assert [la.params for la in layers] == [V * H] + [block] * N + [H * 2 + H * V]
    assert total_params(cfg) == V * H + N * block + 2 * H + H * V
    # per token: the [s, s] einsum (2 s h per token, the mask does not skip FLOPs) and the MLP's two matmuls
    assert [la.fwd_flops_per_token for la in layers] == [0.0] + [2.0 * S * H + 2 * 2 * H * F] * N + [2.0 * H * V]
    assert layer_list(cfg, 16)[1].fwd_flops_per_token == 2.0 * 16 * H + 2 * 2 * H * F  # the mixing follows seq
    assert layers[1].compute_bytes == 4 and layers[1].act_bytes_per_sample > 0


@pytest.mark.parametrize("mixed", [False, True])
def test_the_lean_w_keeps_what_the_builder_layer_list_prices(mixed: bool) -> None:
    """A builder model's W set, counted on meta (each plain nn.Linear call's input and output: per block the
    second norm's output and the GELU's, the two MLP outputs; the head its norm output and logits), is what the
    executor's lean W keeps on a stage of two blocks and the head, in fp32 and under bf16 autocast."""
    import torch

    from hetauto.planner.costmodel import LayerTable, deferred_w_bytes
    from hetauto.runtime.split_backward import LeanW, kept_bytes
    from hetauto.runtime.stage import build_stage

    cfg = get_model(REF)
    layers = layer_list(cfg, S)
    assert (layers[1].wgrad_input_replicated_bytes, layers[1].wgrad_replicated_bytes) == (4 * S * (H + F),) * 2
    assert (layers[-1].wgrad_input_replicated_bytes, layers[-1].wgrad_replicated_bytes) == (4 * S * H, 4 * S * V)
    st = build_stage(cfg, (N - 1, N + 2), SEED)
    store = LeanW.install(st)
    x = torch.randn(2, S, H, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        loss = st(x, torch.randint(0, V, (2, S)), 2 * S)
    b = 2 if mixed else 4
    table = LayerTable(tuple(la.at_compute_bytes(b) for la in layers))
    assert kept_bytes(store.input_grads(loss, None)) == deferred_w_bytes(table.range(N - 1, N + 2), tp=1, dp=1,
                                                                         microbatch=2)


def test_the_planner_plans_it_at_tp_1() -> None:
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.search import plan

    inputs = load_planning_inputs(scenario="cpu-demo", model=REF)
    result = plan(inputs, "mcts", seed=0, max_evaluations=200)
    assert result.plan.model == REF and all(s.tp == 1 for s in result.plan.stages)
    check_plan(result.plan, get_scenario("cpu-demo").cluster, get_model(REF))


def test_the_memory_refusal_quotes_the_tp_a_builder_model_can_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no device memory to spare, the tightest constraint is priced at the widest TP the space has:
    8 on mixed-small's 8-device nodes for a reference model, 1 for a builder model (it has no TP plan)."""
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.search import make_evaluator, tightest_violation
    from hetauto.planner.space import StrategySpace

    monkeypatch.setattr(StrategySpace, "capacity", lambda self, name: 1.0)
    for model, tp in ((REF, 1), ("gpt3-1.3b", 8)):
        inputs = load_planning_inputs(scenario="mixed-small", model=model, seq_len=S)
        why = tightest_violation(StrategySpace(inputs, make_evaluator(inputs)))
        assert f"per device at tp={tp} with recompute and ZeRO-1 > 0.0 GiB available" in why, why


@pytest.mark.parametrize("scenario, seq_len", [("cpu-demo", None), ("mixed-small", S)])
def test_the_baselines_propose_tp_1_only(scenario: str, seq_len: int | None) -> None:
    """Megatron's and AMP's grid (uniform_grid), Metis' ranked shapes and the exhaustive enumeration keep a
    builder model at tp 1, as the search does (StrategySpace.tp_options): `hetauto run` refuses tp > 1 for it.
    The same space offers a reference LLaMA of the same depth tp > 1, so the restriction is what removes it."""
    from hetauto.planner.baselines.exhaustive import all_candidates
    from hetauto.planner.baselines.metis import metis_ranked
    from hetauto.planner.baselines.uniform import uniform_grid
    from hetauto.planner.evaluate import Evaluator
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.space import StrategySpace

    def proposals(model: str) -> dict[str, list]:
        inputs = load_planning_inputs(scenario=scenario, model=model, seq_len=seq_len)
        space = StrategySpace(inputs, Evaluator(inputs))
        return {"grid": list(uniform_grid(space, "uniform")), "metis": [c for _, c in metis_ranked(space, lambda: False)],
                "exhaustive": list(itertools.islice(all_candidates(space), 2000))}

    def widest(cands: list) -> int:
        return max(ch.tp for c in cands for ch in c.choices)

    mine, llama = proposals(REF), proposals("tiny-llama")
    assert all(mine[k] for k in mine) and {k: widest(v) for k, v in mine.items()} == dict.fromkeys(mine, 1)
    assert all(widest(v) > 1 for v in llama.values())


@pytest.mark.parametrize("name, scenario, gbs", [
    ("metis", "two-cluster", None), ("metis", "mixed-small", 4),  # Metis doubled tp to 2 in its last stage here
    ("megatron", "mixed-small", None), ("amp", "mixed-small", None), ("greedy", "mixed-small", None)])
def test_each_baselines_plan_of_a_builder_model_is_one_run_accepts(name: str, scenario: str, gbs: int | None) -> None:
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.search import plan

    result = plan(load_planning_inputs(scenario=scenario, model=REF, seq_len=S, global_batch=gbs), name, seed=0)
    assert [s.tp for s in result.plan.stages] == [1] * len(result.plan.stages)
    check_plan(result.plan, get_scenario(scenario).cluster, get_model(REF))


def _two_stages(tp: int = 1) -> Plan:
    stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1, recompute=True),
              StagePlan(cluster="slow", device_type="cpu", devices=(0, 1), layers=(3, N + 2), tp=tp, dp=2 // tp))
    return Plan(model=REF, cluster="cpu-demo", seq_len=S, global_batch=GBS, microbatch_size=MBS,
                num_microbatches=GBS // MBS, stages=stages)


def _work(rank: int, world: int, plan_json: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.executor import run_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        return run_rank(comm, Plan.from_json(plan_json), get_model(REF),
                        RunConfig.from_flat(steps=3, seed=SEED, timeout_s=30)).to_dict()
    finally:
        comm.destroy()


@pytest.mark.multiprocess
def test_a_two_stage_run_equals_the_single_process_model() -> None:
    plan = _two_stages()
    losses = summarize(plan, run_ranks(_work, 3, plan.to_json(), timeout=120, env=CODE_ENV)).losses
    reference = reference_losses(get_model(REF), SEED, 3, GBS, MBS, S)
    assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-5
    # interleaved 1F1B, two chunks per stage (chunk_layers: stage 0 holds slots [0, 2) and [4, 5), stage 1 [2, 4), [5, 6))
    stages = tuple(StagePlan(cluster=c, device_type="cpu", devices=(0,), layers=l, tp=1, dp=1)
                   for c, l in (("fast", (0, 3)), ("slow", (3, N + 2))))
    inter = Plan(model=REF, cluster="cpu-demo", seq_len=S, global_batch=GBS, microbatch_size=2, num_microbatches=4,
                 stages=stages, schedule={"name": "interleaved", "virtual_chunks": 2})
    losses = summarize(inter, run_ranks(_work, 2, inter.to_json(), timeout=120, env=CODE_ENV)).losses
    assert max(abs(a - b) for a, b in zip(losses, reference_losses(get_model(REF), SEED, 3, GBS, 2, S))) < 1e-5
    assert abs(reference[0] - reference_losses(get_model(REF), SEED + 1, 1, GBS, MBS, S)[0]) > 1e-4  # seeded init


def test_tensor_parallelism_is_refused_with_one_line() -> None:
    with pytest.raises(PlanMismatch) as err:
        check_plan(_two_stages(tp=2), get_scenario("cpu-demo").cluster, get_model(REF))
    assert str(err.value) == (f"stage 1: tp=2, but {REF} is a stage builder model, which runs with tp 1 "
                              "(hetauto.core.user_model has no tensor-parallel plan); use tp 1")


def test_a_builder_that_breaks_the_protocol_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "halfmodel.py").write_text("class Half:\n    vocab_size = 8\n    hidden = 4\n"
                                           "    def embedding(self):\n        return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert is_builder_ref("halfmodel:Half") and not is_builder_ref("tiny-gpt") and not is_builder_ref("a/b.json")
    with pytest.raises(SpecError) as err:
        load_builder("halfmodel:Half")
    assert str(err.value) == ("model: 'halfmodel:Half' lacks num_blocks, max_seq_len, block, head of the stage builder "
                              "protocol (the protocol is vocab_size, hidden, num_blocks, max_seq_len, embedding(), "
                              "block(i), head(): hetauto.core.user_model)")
    with pytest.raises(SpecError) as err:
        get_model("no_such_module_here:Model")
    assert str(err.value) == ("model: cannot import 'no_such_module_here' for 'no_such_module_here:Model': No module "
                              "named 'no_such_module_here' (run from the folder that holds it, or put that folder "
                              "on PYTHONPATH)")


def test_a_forward_the_planner_cannot_count_is_one_line(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "itemmodel.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Scalar(nn.Module):\n    def forward(self, x):\n        return x * float(x.sum().item())\n\n"
        "class Model:\n    vocab_size, hidden, num_blocks, max_seq_len = 8, 4, 1, 8\n"
        "    def embedding(self):\n        return nn.Embedding(8, 4)\n"
        "    def block(self, i):\n        return Scalar()\n"
        "    def head(self):\n        return nn.Linear(4, 8)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError) as err:
        layer_list(get_model("itemmodel:Model"), 8)
    assert str(err.value).startswith("model: itemmodel:Model: block(0)'s forward on a [1, 8] sample on the meta device "
                                     "failed: ")
    assert str(err.value).endswith("(the planner counts it on meta tensors: no .item(), .cpu() or tensors made on a "
                                   "device in forward)")


def _train(rank: int, world: int, plan_json: str, ckdir: str, resume: str | None, steps: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.training import train_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        return train_rank(comm, Plan.from_json(plan_json), get_model(REF),
                          RunConfig.from_flat(steps=steps, seed=SEED, timeout_s=30, checkpoint_dir=ckdir,
                                              resume=resume)).to_dict()
    finally:
        comm.destroy()


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_resumed_run_of_a_builder_model_continues_where_it_stopped(tmp_path: Path) -> None:
    """N steps == N/2 steps, then a resume from their checkpoint for the other N/2: the same losses, bit for bit
    (the user's modules' parameters and Adam state round-trip through the sharded checkpoint)."""
    steps = 4
    stages = tuple(StagePlan(cluster="fast", device_type="cpu", devices=(i,), layers=l, tp=1, dp=1)
                   for i, l in enumerate(((0, 3), (3, N + 2))))
    plan = Plan(model=REF, cluster="cpu-demo", seq_len=S, global_batch=GBS, microbatch_size=MBS,
                num_microbatches=GBS // MBS, stages=stages)
    whole = run_ranks(_train, 2, plan.to_json(), str(tmp_path / "a"), None, steps, timeout=200, env=CODE_ENV)
    half = run_ranks(_train, 2, plan.to_json(), str(tmp_path / "b"), None, steps // 2, timeout=200, env=CODE_ENV)
    rest = run_ranks(_train, 2, plan.to_json(), str(tmp_path / "c"), str(tmp_path / "b"), steps, timeout=200, env=CODE_ENV)
    assert rest[0]["start_step"] == steps // 2
    losses = list(summarize(plan, whole).losses)
    assert list(summarize(plan, half).losses) + list(summarize(plan, rest).losses) == losses
    assert len(set(losses)) == steps  # it trains: a resume that restarted from the initial weights would differ
