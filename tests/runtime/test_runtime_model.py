"""Reference model, stage partitioning, synthetic data and reference training (single process)."""

from __future__ import annotations

import math

import pytest
import torch

from hetauto.core.model import ModelConfig
from hetauto.runtime.data import Batch, dp_shard, microbatch, num_microbatches, synthetic_batch
from hetauto.runtime.model import _rotary, build_slot, lm_loss
from hetauto.runtime.reference import make_optimizer, reference_losses
from hetauto.runtime.stage import build_model, build_stage

GPT = ModelConfig("tiny-gpt", "gpt", num_layers=4, hidden=32, num_heads=4, ffn_hidden=64, vocab_size=50, max_seq_len=16)
LLAMA = ModelConfig(
    "tiny-llama", "llama", num_layers=4, hidden=32, num_heads=4, ffn_hidden=48, vocab_size=50, max_seq_len=16,
    num_kv_heads=2,
)
TIED = ModelConfig("tiny-tied", "gpt", num_layers=2, hidden=32, num_heads=2, ffn_hidden=64, vocab_size=40,
                   max_seq_len=16, tie_embeddings=True)

# Partitions of the 6 slots [emb, b0..b3, head].
PARTITIONS = [
    [(0, 6)],
    [(0, 1), (1, 6)],
    [(0, 3), (3, 6)],
    [(0, 5), (5, 6)],
    [(0, 2), (2, 4), (4, 6)],
    [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)],
]


def _tokens(cfg: ModelConfig, b: int = 3, s: int = 12) -> Batch:
    return synthetic_batch(7, 0, b, s, cfg.vocab_size)


@pytest.mark.parametrize("cfg", [GPT, LLAMA], ids=["gpt", "llama"])
@pytest.mark.parametrize("partition", PARTITIONS, ids=lambda p: "-".join(f"{a}:{b}" for a, b in p))
def test_chained_stages_equal_whole_model_bit_exactly(cfg: ModelConfig, partition: list[tuple[int, int]]) -> None:
    batch = _tokens(cfg)
    whole = build_model(cfg, seed=3)
    want_loss = whole(batch.tokens, batch.targets)
    want_loss.backward()
    want_grads = {n: p.grad for n, p in whole.named_parameters()}

    stages = [build_stage(cfg, r, seed=3) for r in partition]
    x = batch.tokens
    for st in stages[:-1]:
        x = st(x)
    loss = stages[-1](x, batch.targets)
    loss.backward()
    assert torch.equal(loss, want_loss)
    got = {n: p.grad for st in stages for n, p in st.named_parameters()}
    assert got.keys() == want_grads.keys()
    for n in got:
        assert torch.equal(got[n], want_grads[n]), n


def test_slot_weights_depend_only_on_seed_and_slot() -> None:
    torch.manual_seed(0)
    a = dict(build_slot(LLAMA, 2, seed=5).named_parameters())
    torch.manual_seed(123)  # the global RNG must not matter
    b = dict(build_slot(LLAMA, 2, seed=5).named_parameters())
    c = dict(build_slot(LLAMA, 3, seed=5).named_parameters())
    d = dict(build_slot(LLAMA, 2, seed=6).named_parameters())
    for n in a:
        assert torch.equal(a[n], b[n])
    assert not torch.equal(a["attn.q_proj.weight"], c["attn.q_proj.weight"])
    assert not torch.equal(a["attn.q_proj.weight"], d["attn.q_proj.weight"])
    assert torch.all(a["norm1.weight"] == 1.0)
    # N(0, 0.02) for matrices; residual outputs scaled by 1/sqrt(2N) = 1/sqrt(8)
    assert abs(a["attn.q_proj.weight"].std().item() - 0.02) < 0.004
    assert abs(a["mlp.down.weight"].std().item() - 0.02 / math.sqrt(8)) < 0.002


def test_parameter_names_carry_the_global_slot() -> None:
    names = [n for n, _ in build_stage(GPT, (2, 4), seed=0).named_parameters()]
    assert names[0] == "layers.2.norm1.weight"
    assert {n.split(".")[1] for n in names} == {"2", "3"}
    llama_names = {n for n, _ in build_stage(LLAMA, (1, 2), seed=0).named_parameters()}
    assert "layers.1.mlp.gate.weight" in llama_names and not any(n.endswith("bias") for n in llama_names)
    assert build_stage(LLAMA, (1, 2), seed=0).layers["1"].attn.k_proj.weight.shape == (2 * 8, 32)  # GQA: 2 kv heads


def test_rotary_is_a_relative_position_rotation() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(8, generator=g).expand(1, 1, 6, 8)  # the same vector at 6 positions
    k = torch.randn(8, generator=g).expand(1, 1, 6, 8)
    rq, rk = _rotary(q), _rotary(k)
    assert torch.equal(rq[..., 0, :], q[..., 0, :])  # position 0 is not rotated
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))  # a rotation keeps norms
    scores = (rq[0, 0] @ rk[0, 0].T)  # [6, 6]; rotary makes them depend only on (m - n)
    for m, n in [(3, 1), (4, 2), (5, 3)]:
        torch.testing.assert_close(scores[m, n], scores[2, 0], rtol=0, atol=1e-5)
    assert abs(scores[2, 0] - scores[1, 0]) > 1e-3
    assert build_stage(LLAMA, (0, 1), seed=0).layers["0"].pos is None
    assert build_stage(GPT, (0, 1), seed=0).layers["0"].pos.weight.shape == (16, 32)


def test_tied_embeddings_share_one_parameter_whole_and_sum_gradients_when_split() -> None:
    batch = _tokens(TIED)
    whole = build_model(TIED, seed=1)
    assert whole.layers["3"].proj.weight is whole.layers["0"].tok.weight
    assert whole.tied_embedding_weight() is None
    whole(batch.tokens, batch.targets).backward()
    first, last = build_stage(TIED, (0, 2), seed=1), build_stage(TIED, (2, 4), seed=1)
    assert torch.equal(first.tied_embedding_weight(), last.tied_embedding_weight())
    last(first(batch.tokens), batch.targets).backward()
    summed = first.tied_embedding_weight().grad + last.tied_embedding_weight().grad
    torch.testing.assert_close(summed, whole.layers["0"].tok.weight.grad, rtol=0, atol=1e-7)


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"layer range \[3, 7\) is not inside \[0, 6\)"):
        build_stage(GPT, (3, 7), seed=0)
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len 16"):
        build_stage(GPT, (0, 1), seed=0)(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="takes token ids"):
        build_stage(GPT, (0, 1), seed=0)(torch.zeros(1, 4, 32))
    with pytest.raises(ValueError, match="only the last stage computes the loss"):
        build_stage(GPT, (1, 2), seed=0)(torch.zeros(1, 4, 32), torch.zeros(1, 4, dtype=torch.long))


def test_lm_loss_is_global_mean_share() -> None:
    logits = torch.zeros(2, 3, 5)  # uniform: every token costs ln 5
    targets = torch.zeros(2, 3, dtype=torch.long)
    assert lm_loss(logits, targets, normaliser=6).item() == pytest.approx(math.log(5), abs=1e-6)
    assert lm_loss(logits, targets, normaliser=24).item() == pytest.approx(math.log(5) / 4, abs=1e-6)


def test_synthetic_batch_is_deterministic_and_shifted() -> None:
    a = synthetic_batch(1, 4, 8, 10, 50)
    b = synthetic_batch(1, 4, 8, 10, 50)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    assert a.tokens.dtype == torch.long and a.tokens.shape == (8, 10)
    assert torch.equal(a.tokens[:, 1:], a.targets[:, :-1])
    assert not torch.equal(synthetic_batch(1, 5, 8, 10, 50).tokens, a.tokens)
    assert not torch.equal(synthetic_batch(2, 4, 8, 10, 50).tokens, a.tokens)
    assert int(a.tokens.max()) < 50 and int(a.tokens.min()) >= 0


def test_microbatch_and_dp_shard_rows() -> None:
    batch = Batch(torch.arange(12).view(12, 1), torch.arange(12).view(12, 1) + 100)
    assert num_microbatches(12, 4) == 3
    mb = microbatch(batch, 1, 4)
    assert mb.tokens.flatten().tolist() == [4, 5, 6, 7]
    assert mb.targets.flatten().tolist() == [104, 105, 106, 107]
    assert dp_shard(mb, 1, 2).tokens.flatten().tolist() == [6, 7]
    assert dp_shard(mb, 3, 4).tokens.flatten().tolist() == [7]
    assert dp_shard(torch.arange(4), 0, 2).tolist() == [0, 1]
    with pytest.raises(ValueError, match="not a multiple of the microbatch size 5"):
        num_microbatches(12, 5)
    with pytest.raises(ValueError, match="cannot be split evenly across dp=3"):
        dp_shard(mb, 0, 3)


def _manual_losses(cfg: ModelConfig, seed: int, steps: int, gbs: int, mbs: int, s: int, lr: float,
                   dp: int) -> list[float]:
    """The same training, written as a dp-sharded loop with per-shard backward (what the executor does)."""
    model = build_model(cfg, seed)
    opt = make_optimizer(model.parameters(), lr)
    out = []
    for step in range(steps):
        batch = synthetic_batch(seed, step, gbs, s, cfg.vocab_size)
        total = 0.0
        for j in range(gbs // mbs):
            for d in range(dp):
                shard = dp_shard(microbatch(batch, j, mbs), d, dp)
                loss = model(shard.tokens, shard.targets, gbs * s)
                loss.backward()
                total += loss.item()
        opt.step()
        opt.zero_grad()
        out.append(total)
    return out


def test_reference_losses_fall_and_match_a_sharded_accumulation() -> None:
    losses = reference_losses(LLAMA, seed=0, steps=4, gbs=8, microbatch_size=2, seq_len=8, lr=3e-3)
    assert len(losses) == 4
    # first step: untrained model, close to uniform over 50 tokens
    assert abs(losses[0] - math.log(50)) < 0.1
    assert losses[-1] < losses[0]
    again = reference_losses(LLAMA, seed=0, steps=4, gbs=8, microbatch_size=2, seq_len=8, lr=3e-3)
    assert losses == again
    sharded = _manual_losses(LLAMA, 0, 4, 8, 2, 8, 3e-3, dp=2)
    assert sharded == pytest.approx(losses, abs=1e-5)
    # a different microbatch split gives the same losses (same global-mean objective)
    assert reference_losses(LLAMA, 0, 4, 8, 4, 8, 3e-3) == pytest.approx(losses, abs=1e-5)


# --- throttle (heterogeneity emulation) ---------------------------------------------------------------

from hetauto.runtime.throttle import Throttle  # noqa: E402


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_throttle_stretches_work_to_t_over_speed_factor_exactly() -> None:
    fake = _FakeClock()
    th = Throttle(0.25, clock=fake.clock, sleep=fake.sleep)

    def work(t: float) -> str:
        fake.now += t
        return "done"

    start = fake.now
    assert th.run(work, 2.0) == "done"
    assert fake.now - start == pytest.approx(8.0)  # 2 s of work on a device 4x slower
    assert fake.sleeps == [pytest.approx(6.0)]
    with th:
        fake.now += 1.0
    assert th.slept_s == pytest.approx(9.0) and th.calls == 2
    fast = Throttle(2.0, clock=fake.clock, sleep=fake.sleep)
    fast.run(work, 1.0)
    assert fast.slept_s == 0.0 and len(fake.sleeps) == 2  # cannot speed up: adds nothing


def test_throttle_counts_synchronize_and_rejects_bad_factors() -> None:
    fake = _FakeClock()
    th = Throttle(0.5, synchronize=lambda: setattr(fake, "now", fake.now + 1.0), clock=fake.clock, sleep=fake.sleep)
    with th:
        pass  # the 1 s of asynchronous device work is only seen through synchronize
    assert th.slept_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="speed_factor must be > 0"):
        Throttle(0.0)
    with pytest.raises(RuntimeError, match="not re-entrant"):
        with th:
            with th:
                pass


def test_throttle_really_sleeps() -> None:
    import time

    th = Throttle(0.5)
    t0 = time.perf_counter()
    th.run(time.sleep, 0.05)
    assert time.perf_counter() - t0 >= 0.099


@pytest.mark.parametrize("layers", [(0, 6), (2, 4)])
def test_recompute_gives_bit_identical_gradients(layers: tuple[int, int]) -> None:
    batch = _tokens(GPT)
    grads = []
    for recompute in (False, True):
        st = build_stage(GPT, layers, seed=2, recompute=recompute)
        if layers[0] == 0:
            st(batch.tokens, batch.targets).backward()
        else:
            x = torch.randn(3, 12, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
            st(x).sum().backward()
        grads.append(_grads_of(st))
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert torch.equal(grads[0][n], grads[1][n]), n


def test_recompute_really_discards_block_activations() -> None:
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    counts = []
    for recompute in (False, True):
        saved.clear()
        st = build_stage(GPT, (1, 5), seed=2, recompute=recompute)
        x = torch.randn(2, 8, 32, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            st(x)
        counts.append(sum(saved))
    assert counts[1] < counts[0] / 4  # only each block's input is kept


def _grads_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in module.named_parameters()}
