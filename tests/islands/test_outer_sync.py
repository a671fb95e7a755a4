"""The outer math of island plans (issue 40), in one process: OuterOptimizer's Nesterov step by hand, the merge,
the fragment schedule, the wire codecs, contribution formats, and what the single-process island reference
(hetauto.runtime.island_reference) must satisfy."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from hetauto.core.islands import INT8_BLOCK, WIRE_BYTES, Island, IslandPlan, OuterSync, WireLink
from hetauto.core.islands import OuterOptimizer as OuterSettings
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, StagePlan
from hetauto.core.run_config import RunConfig
from hetauto.runtime.batches import BatchSource, IslandBatches
from hetauto.runtime.island_reference import fragment_names, reference_islands
from hetauto.runtime.outer_sync import (OuterOptimizer, due_fragments, fragment_of, fragment_slots, merge,
                                        sending_fragments)
from hetauto.runtime.reference import reference_run
from hetauto.runtime.wire_codec import contribution_format, decode, encode, payload_bytes, round_trip

SEQ, MICRO = 16, 4


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------ OuterOptimizer: Nesterov by hand


def _outer(lr: float = 0.5, momentum: float = 0.5) -> tuple[OuterOptimizer, dict[str, torch.Tensor]]:
    local = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([4.0])}
    return OuterOptimizer(local, lr=lr, momentum=momentum), local


def test_one_and_two_nesterov_steps_by_hand() -> None:
    """buf = g; update = g + mu*buf; theta -= lr*update; then buf = mu*buf + g (all values exact in binary)."""
    outer, local = _outer()
    local["a"].sub_(torch.tensor([0.25, -0.5]))  # the inner steps moved a by -g
    g1 = outer.pseudo_gradient(["a"])["a"]
    assert torch.equal(g1, torch.tensor([0.25, -0.5]))
    outer.step({"a": g1})
    assert torch.equal(outer.global_params["a"], torch.tensor([0.8125, 2.375]))  # 1 - 0.5*1.5*0.25, 2 + 0.375
    assert torch.equal(local["a"], outer.global_params["a"])  # the island continues from the new theta
    g2 = torch.tensor([0.5, 0.5])
    outer.step({"a": g2})  # buf = 0.5*[0.25, -0.5] + g2 = [0.625, 0.25]; update = g2 + 0.5*buf = [0.8125, 0.625]
    assert torch.equal(outer.global_params["a"], torch.tensor([0.40625, 2.0625]))
    assert torch.equal(outer.state_dict()["momentum"]["a"], torch.tensor([0.625, 0.25]))
    assert outer.rounds == 2


def test_momentum_is_kept_per_parameter_across_fragments() -> None:
    """Stepping fragment b leaves a's theta and momentum alone; a's next step uses its own buffer."""
    outer, local = _outer()
    outer.step({"a": torch.tensor([0.25, -0.5])})
    a_after_first = outer.global_params["a"].clone()
    outer.step({"b": torch.tensor([1.0])})  # b: buf = 1, update 1.5, theta 4 - 0.75
    assert torch.equal(outer.global_params["a"], a_after_first)
    assert torch.equal(outer.global_params["b"], torch.tensor([3.25]))
    outer.step({"a": torch.tensor([0.5, 0.5])})
    assert torch.equal(outer.global_params["a"], torch.tensor([0.40625, 2.0625]))  # as if b never stepped
    assert torch.equal(local["b"], torch.tensor([3.25]))


def test_momentum_zero_is_plain_sgd() -> None:
    outer, _ = _outer(lr=1.0, momentum=0.0)
    outer.step({"a": torch.tensor([0.25, 0.5])})
    outer.step({"a": torch.tensor([0.25, 0.5])})
    assert torch.equal(outer.global_params["a"], torch.tensor([0.5, 1.0]))
    assert outer.state_dict()["momentum"] == {}


def test_state_dict_round_trip_continues_identically() -> None:
    outer, _ = _outer()
    outer.step({"a": torch.tensor([0.25, -0.5]), "b": torch.tensor([0.125])})
    saved = {k: ({n: t.clone() for n, t in v.items()} if isinstance(v, dict) else v)
             for k, v in outer.state_dict().items()}
    resumed, resumed_local = _outer()
    resumed.load_state_dict(saved)
    assert resumed.rounds == 1
    g = {"a": torch.tensor([0.5, 0.5]), "b": torch.tensor([-0.25])}
    outer.step(g)
    resumed.step(g)
    for name in ("a", "b"):
        assert torch.equal(resumed.global_params[name], outer.global_params[name])
        assert torch.equal(resumed_local[name], outer.global_params[name])
        assert torch.equal(resumed.state_dict()["momentum"][name], outer.state_dict()["momentum"][name])


# ------------------------------------------------------------------ merge


def test_merge_is_the_weighted_sum_in_island_order() -> None:
    a, b, c = torch.tensor([1.0, 4.0]), torch.tensor([2.0, 8.0]), torch.tensor([4.0, -4.0])
    assert torch.equal(merge([a, b, c], [0.5, 0.25, 0.25]), torch.tensor([2.0, 3.0]))
    big, one = torch.tensor([1e8]), torch.tensor([1.0])
    # fp32 is not associative: the left fold in island order is the contract (1 + 1e8 rounds to 1e8)
    assert merge([one, big, -big], [1.0, 1.0, 1.0]).item() == 0.0
    assert merge([big, -big, one], [1.0, 1.0, 1.0]).item() == 1.0
    with pytest.raises(ValueError):
        merge([a, b], [1.0])
    with pytest.raises(ValueError):
        merge([], [])


def test_merge_gives_the_same_bits_wherever_it_is_computed() -> None:
    """A holder merges whole tensors; every island, every slice, any thread count must get the same bits."""
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(4099, generator=gen) * 1e-3 for _ in range(3)]
    weights = (0.375, 0.5, 0.125)
    whole = merge(parts, weights)
    torch.set_num_threads(2)
    assert torch.equal(merge(parts, weights), whole)
    torch.set_num_threads(1)
    assert torch.equal(merge([p[1000:2000] for p in parts], weights), whole[1000:2000])
    assert torch.equal(merge([p.to(torch.bfloat16).float() for p in parts], weights),
                       merge([p.to(torch.bfloat16) for p in parts], weights))


# ------------------------------------------------------------------ the fragment schedule


def test_fragment_slots_table() -> None:
    assert fragment_slots(6, 1) == (range(0, 6),)
    assert fragment_slots(6, 4) == (range(0, 2), range(2, 4), range(4, 5), range(5, 6))
    assert fragment_slots(7, 3) == (range(0, 3), range(3, 5), range(5, 7))
    assert [fragment_of(s, 7, 3) for s in range(7)] == [0, 0, 0, 1, 1, 2, 2]
    for bad in (0, 8):
        with pytest.raises(ValueError, match="fragments must be in"):
            fragment_slots(7, bad)


@pytest.mark.parametrize("h, f, table", [
    (4, 1, {3: (0,), 7: (0,)}),
    (4, 2, {1: (0,), 3: (1,), 5: (0,), 7: (1,)}),
    (6, 4, {0: (0,), 2: (1,), 3: (2,), 5: (3,), 6: (0,), 8: (1,), 9: (2,), 11: (3,)}),
    (3, 3, {s: (s % 3,) for s in range(6)}),
])
def test_due_fragments_table(h: int, f: int, table: dict[int, tuple[int, ...]]) -> None:
    assert {s: due_fragments(s, h, f) for s in range(2 * h) if due_fragments(s, h, f)} == table


@pytest.mark.parametrize("h, f", [(1, 1), (5, 2), (8, 4), (7, 7), (12, 5)])
def test_every_fragment_syncs_once_per_round_at_torchfts_offset(h: int, f: int) -> None:
    for start in range(0, 3 * h, h):
        due = [x for s in range(start, start + h) for x in due_fragments(s, h, f)]
        assert sorted(due) == list(range(f))
    if h % f == 0:  # torchft's Streaming DiLoCo: fragment i after floor(H/F * (i+1)) steps of each round
        for i in range(f):
            assert i in due_fragments(math.floor(h / f * (i + 1)) - 1, h, f)


@pytest.mark.parametrize("h, f, tau", [(4, 1, 3), (4, 2, 1), (6, 4, 0), (12, 5, 1), (8, 2, 3)])
def test_a_fragment_is_sent_tau_steps_before_its_outer_step_and_one_is_in_flight_at_a_time(h: int, f: int,
                                                                                           tau: int) -> None:
    events = []  # (step, "send"/"land", fragment) in the order a rank meets them
    for s in range(3 * h):
        events += [(s, "send", x) for x in sending_fragments(s, h, f, tau)]
        events += [(s, "land", x) for x in due_fragments(s, h, f)]
    sends = {(s, x) for s, what, x in events if what == "send"}
    lands = {(s, x) for s, what, x in events if what == "land"}
    assert {(s + tau, x) for s, x in sends if s + tau < 3 * h} == {(s, x) for s, x in lands if s >= tau}
    in_flight = 0
    for _, what, _ in events:
        in_flight += 1 if what == "send" else -1
        assert in_flight in (0, 1)
    assert sending_fragments(5, h, f, 0) == due_fragments(5, h, f)


def test_overlap_steps_is_below_the_spacing_and_absent_from_json_at_0() -> None:
    wire = (WireLink(between=("a", "b")),)
    plain = OuterSync(inner_steps=4, fragments=2, wire=wire)
    assert "overlap_steps" not in plain.model_dump(mode="json") and "update_alpha" not in plain.model_dump()
    streaming = OuterSync(inner_steps=4, fragments=2, wire=wire, overlap_steps=1, update_alpha=0.5)
    assert streaming.model_dump()["overlap_steps"] == 1 and streaming.model_dump()["update_alpha"] == 0.5
    with pytest.raises(ValueError, match=r"overlap_steps 2 >= 2, the inner steps between two fragment syncs "
                                         r"\(inner_steps 4 // fragments 2\).*give overlap_steps below 2"):
        OuterSync(inner_steps=4, fragments=2, wire=wire, overlap_steps=2)
    for bad in ({"overlap_steps": -1}, {"update_alpha": 1.5}):
        with pytest.raises(ValueError):
            OuterSync(inner_steps=4, wire=wire, **bad)


def test_with_tau_the_reference_lands_the_pseudo_gradient_taken_tau_steps_earlier() -> None:
    """tau = 1, H = 2: the pseudo-gradient of step 0 lands after step 1; the local progress of step 1 is dropped
    (alpha 0), so after step 1 every island holds the same parameters, which differ from the blocking sync's."""
    run = RunConfig.from_flat(steps=2, seed=3, lr=3e-3)
    blocking = reference_islands(_plan(), get_model("tiny-gpt"), run)
    overlapped = reference_islands(_plan(overlap=1), get_model("tiny-gpt"), run)
    assert blocking.losses == overlapped.losses and blocking.rounds == overlapped.rounds == 1
    for name, p in overlapped.params[0].items():
        assert torch.equal(p, overlapped.params[1][name]), name
    assert any(not torch.equal(p, blocking.params[0][n]) for n, p in overlapped.params[0].items())


# ------------------------------------------------------------------ wire codecs


def _values(n: int = 1000) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 1, n)


def test_fp32_is_exact_and_bf16_is_torchs_cast() -> None:
    t = _values().reshape(10, 100)
    assert torch.equal(round_trip(t, "fp32"), t)
    assert torch.equal(round_trip(t, "bf16"), t.to(torch.bfloat16).float())
    assert round_trip(t, "bf16").shape == t.shape and round_trip(t, "bf16").dtype == torch.float32


def test_int8_error_is_at_most_half_a_scale_per_value_with_padding() -> None:
    t = _values(3 * INT8_BLOCK + 17)  # not a whole number of blocks: the last block is padded
    values, scales = encode(t, "int8")
    assert values.dtype == torch.int8 and values.numel() == 4 * INT8_BLOCK and scales.numel() == 4
    assert torch.equal(values[t.numel():], torch.zeros(INT8_BLOCK - 17, dtype=torch.int8))
    back = decode((values, scales), "int8", t)
    per_value = torch.repeat_interleave(scales, INT8_BLOCK)[: t.numel()]
    assert back.shape == t.shape
    assert bool(((back - t).abs() <= per_value / 2 * (1 + 1e-5)).all())
    blocks = torch.nn.functional.pad(t, (0, 4 * INT8_BLOCK - t.numel())).reshape(4, INT8_BLOCK)
    assert torch.equal(scales, blocks.abs().amax(dim=1) / 127.0)


def test_int8_of_zeros_is_zeros() -> None:
    z = torch.zeros(300)
    values, scales = encode(z, "int8")
    assert torch.equal(scales, torch.zeros(2)) and not values.any()
    assert torch.equal(round_trip(z, "int8"), z)
    mixed = torch.cat([torch.zeros(INT8_BLOCK), torch.ones(INT8_BLOCK)])  # a zero block beside a nonzero one
    assert torch.equal(round_trip(mixed, "int8"), mixed)


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("n", [1, 255, 256, 4096, 5000])
def test_payload_bytes_is_what_encode_sends_and_the_planners_figure(fmt: str, n: int) -> None:
    sent = sum(p.numel() * p.element_size() for p in encode(torch.ones(n), fmt))
    assert payload_bytes(n, fmt) == sent
    if fmt != "int8" or n % INT8_BLOCK == 0:
        assert payload_bytes(n, fmt) == n * WIRE_BYTES[fmt]
    else:  # int8 pads the last block: within one block of the planner's per-parameter figure
        assert n * WIRE_BYTES[fmt] < payload_bytes(n, fmt) <= (n + INT8_BLOCK) * WIRE_BYTES[fmt]


def test_unknown_wire_format_is_one_line() -> None:
    for call in (lambda: encode(torch.ones(2), "fp8"), lambda: payload_bytes(2, "fp8"),
                 lambda: decode((torch.ones(2),), "fp8", torch.ones(2))):
        with pytest.raises(ValueError, match="expected one of fp32, bf16, int8"):
            call()


# ------------------------------------------------------------------ island plans for the reference


def _island(name: str, batch: int) -> Island:
    stage = StagePlan(cluster=name, device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1)
    return Island(name=name, plan=Plan(model="tiny-gpt", cluster="test", seq_len=SEQ, global_batch=batch,
                                       microbatch_size=MICRO, num_microbatches=batch // MICRO, stages=(stage,)))


def _plan(batches: tuple[int, ...] = (8, 4), *, h: int = 2, fragments: int = 1, formats: tuple[str, ...] = ("fp32",),
          lr: float = 0.7, momentum: float = 0.9, overlap: int = 0) -> IslandPlan:
    names = [chr(ord("a") + i) for i in range(len(batches))]
    pairs = [(x, y) for i, x in enumerate(names) for y in names[i + 1:]]
    wire = tuple(WireLink(between=p, format=formats[k % len(formats)]) for k, p in enumerate(pairs))
    return IslandPlan(model="tiny-gpt", cluster="test", seq_len=SEQ, global_batch=sum(batches),
                      islands=tuple(_island(n, b) for n, b in zip(names, batches)),
                      outer=OuterSync(inner_steps=h, fragments=fragments, wire=wire, overlap_steps=overlap,
                                      optimizer=OuterSettings(lr=lr, momentum=momentum)))


def test_contribution_format_with_three_islands() -> None:
    """Each island sends one encoding, the coarsest of its links: a-b fp32, a-c bf16, b-c int8."""
    plan = _plan((4, 4, 4), formats=("fp32", "bf16", "int8"))
    assert [plan.wire_format(*p) for p in (("a", "b"), ("a", "c"), ("b", "c"))] == ["fp32", "bf16", "int8"]
    assert [contribution_format(plan, n) for n in "abc"] == ["bf16", "int8", "int8"]
    with pytest.raises(ValueError, match="no outer.wire entry"):
        contribution_format(plan, "z")


def _alone(plan: IslandPlan, index: int, run: RunConfig):
    """Island `index` trained by hetauto.runtime.reference alone: its own plan, its rows of the stream."""
    source = BatchSource(run.training.seed, get_model("tiny-gpt").vocab_size)
    rows = IslandBatches(source, plan.global_batch, *plan.rows(index))
    return reference_run(get_model("tiny-gpt"), plan.islands[index].plan, run.training, run.data, source=rows)


def test_islands_that_never_sync_are_the_ordinary_reference_on_their_rows() -> None:
    plan, run = _plan((8, 4), h=5, formats=("int8",)), RunConfig.from_flat(steps=3, seed=2, lr=1e-3)
    ref = reference_islands(plan, get_model("tiny-gpt"), run)
    assert ref.rounds == 0
    for i in range(2):
        assert ref.losses[i] == tuple(_alone(plan, i, run).losses)
    assert ref.losses[0] != ref.losses[1]


def test_one_round_at_outer_lr_1_without_momentum_is_the_mean_of_the_islands() -> None:
    """theta - 1.0 * (0.5 (theta - a) + 0.5 (theta - b)) = (a + b) / 2: up to fp32 rounding of the subtractions
    (a few ulps of the parameters, |p| < 4: 1e-6)."""
    plan = _plan((4, 4), h=2, lr=1.0, momentum=0.0)
    run = RunConfig.from_flat(steps=2, seed=3, lr=1e-3)
    ref = reference_islands(plan, get_model("tiny-gpt"), run)
    assert ref.rounds == 1
    alone = [_island_params(plan, i, run) for i in range(2)]
    assert alone[0].keys() == ref.params[0].keys()
    for name, p in ref.params[0].items():
        assert torch.equal(p, ref.params[1][name])
        torch.testing.assert_close(p, (alone[0][name] + alone[1][name]) / 2, rtol=0, atol=1e-6)
    assert any(not torch.equal(alone[0][n], alone[1][n]) for n in alone[0])  # the islands did train apart


def _island_params(plan: IslandPlan, index: int, run: RunConfig) -> dict[str, torch.Tensor]:
    """Island `index`'s parameters after `run`'s steps alone (no sync): the reference with H beyond the steps."""
    lone = plan.model_copy(update={"outer": plan.outer.model_copy(update={"inner_steps": run.training.steps + 1})})
    return reference_islands(lone, get_model("tiny-gpt"), run).params[index]


@pytest.mark.parametrize("fmt", ["fp32", "int8"])
def test_every_island_holds_the_same_fragment_after_its_sync(fmt: str) -> None:
    """Unequal batches, two fragments, streaming: after each fragment's sync every island holds the same bits
    of that fragment (the other fragment has trained on since its own sync)."""
    plan = _plan((8, 4), h=2, fragments=2, formats=(fmt,))
    cfg = get_model("tiny-gpt")
    run = RunConfig.from_flat(steps=3, seed=4, lr=1e-3)  # fragment 0 syncs after step 0 and 2, fragment 1 after 1
    ref = reference_islands(plan, cfg, run)
    assert ref.rounds == 3
    first, second = fragment_names(list(ref.params[0]), cfg.num_layer_slots, 2)
    assert all(torch.equal(ref.params[0][n], ref.params[1][n]) for n in first)
    assert not all(torch.equal(ref.params[0][n], ref.params[1][n]) for n in second)


def test_a_tied_table_syncs_with_the_embedding_and_the_head_follows() -> None:
    cfg = replace(get_model("tiny-gpt"), name="tiny-tied", tie_embeddings=True)
    n = cfg.num_layer_slots
    run = RunConfig.from_flat(steps=1, seed=5, lr=1e-3)
    plan = _plan((4, 4), h=2, fragments=2)  # fragment 0 (slots 0..2) syncs after step 0; the head's after step 1
    ref = reference_islands(plan, cfg, run)
    head = f"layers.{n - 1}.proj.weight"
    assert head in ref.params[0] and torch.equal(ref.params[0][head], ref.params[0]["layers.0.tok.weight"])
    assert torch.equal(ref.params[0][head], ref.params[1][head])
    groups = fragment_names(["layers.0.tok.weight", f"layers.{n - 2}.ln.weight"], n, 2)
    assert groups == (("layers.0.tok.weight",), (f"layers.{n - 2}.ln.weight",))


def test_the_reference_merges_each_islands_wire_round_trip_by_tokens() -> None:
    """Three islands (batches 8, 4, 4: weights 1/2, 1/4, 1/4; contributions in bf16, int8, int8), one step, outer lr
    1 without momentum: the synced model is theta0 - merge(round_trip(theta0 - island_i)), bit for bit."""
    from hetauto.runtime.stage import build_model

    plan = _plan((8, 4, 4), h=1, formats=("fp32", "bf16", "int8"), lr=1.0, momentum=0.0)
    assert plan.token_weights() == (0.5, 0.25, 0.25)
    run = RunConfig.from_flat(steps=1, seed=6, lr=1e-3)
    ref = reference_islands(plan, get_model("tiny-gpt"), run)
    start = dict(build_model(get_model("tiny-gpt"), 6).named_parameters())
    alone = [_island_params(plan, i, run) for i in range(3)]
    formats = ("bf16", "int8", "int8")
    for name, theta in start.items():
        contributions = [round_trip(theta.detach() - alone[i][name], formats[i]) for i in range(3)]
        expected = theta.detach() - merge(contributions, plan.token_weights())
        for i in range(3):
            assert torch.equal(ref.params[i][name], expected), name
