"""The lean W (hetauto.runtime.split_backward): I then W give the unsplit backward's gradients bit for bit, keep
exactly what the memory model prices, and run one recompute per backward under activation checkpointing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hetauto.core.model import ModelConfig
from hetauto.planner.costmodel import LayerTable, deferred_w_bytes
from hetauto.planner.layers import layer_list
from hetauto.runtime import w_offload
from hetauto.runtime.split_backward import LeanW, kept_bytes
from hetauto.runtime.stage import build_stage


def _autocast(mixed: bool):  # noqa: ANN202 - a context manager
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed)


@pytest.mark.parametrize("mixed", [False, True])
def test_the_kept_matmuls_are_autograds_linear_backward(mixed: bool) -> None:
    """aten's linear on [.., in] rows (addmm with a bias, else mm, on the flattened input) backprops mm's way:
    input gradient g @ W, weight gradient g^T @ x, bias gradient the rows' sum, all in autocast's dtype, then cast
    to the leaves' fp32. The lean Function's, bitwise, at llama-like widths (176 = ffn of tiny-llama), 2-D to
    4-D inputs, with and without a bias."""
    torch.manual_seed(0)
    for shape, out, bias in (((2, 16, 64), 176, False), ((2, 16, 176), 64, True), ((3, 5, 7, 64), 96, True),
                             ((32, 64), 24, False)):
        x0, w0 = torch.randn(*shape), torch.randn(out, shape[-1])
        b0 = torch.randn(out) if bias else None
        g = torch.randn(*shape[:-1], out)
        grads = []
        for lean in (False, True):
            lin = nn.Linear(shape[-1], out, bias=bias)
            with torch.no_grad():
                lin.weight.copy_(w0)
                if bias:
                    lin.bias.copy_(b0)
            store = LeanW.install(lin) if lean else None
            x = x0.clone().requires_grad_()
            with _autocast(mixed):
                y = lin(x)
            if store is None:
                y.backward(g.to(y.dtype))
            else:
                LeanW.weight_grads(store.input_grads(y, g.to(y.dtype)))
            grads.append([x.grad, *(p.grad for p in lin.parameters())])
        assert all(torch.equal(a, b) for a, b in zip(*grads)), (shape, bias)


def _run(stage: nn.Module, xs: list[torch.Tensor], targets: torch.Tensor, mixed: bool, store: LeanW | None,
         offload: bool = False) -> list:
    """Each microbatch's forward, then (lean) every I before any W, as a deferring stage runs them, the W sets
    waiting in host memory with `offload` (hetauto.runtime.w_offload: a real copy, sharing no storage with the
    device set, each shared input copied once, back before W); returns the input gradients and the bytes one
    set keeps after the last I (with `offload`: in host memory, the device set dropped)."""
    outs = []
    for x in xs:
        with _autocast(mixed):
            outs.append(stage(x, targets, targets.numel()))
    if store is None:
        for y in outs:
            y.backward()
        return [x.grad for x in xs] + [0]
    kept = [store.input_grads(y, None) for y in outs]
    if offload:
        host = [w_offload.to_host(k) for k in kept]
        on_dev = {t.untyped_storage().data_ptr() for k in kept for kk in k for t in (kk.inp, kk.grad_out)}
        assert not on_dev & {t.untyped_storage().data_ptr() for k in host for kk in k for t in (kk.inp, kk.grad_out)}
        kept = [w_offload.to_device(k, torch.device("cpu")) for k in host]
        held = kept_bytes(host[0])
    else:
        held = kept_bytes(kept[0])
    for k in kept:
        LeanW.weight_grads(k)
    return [x.grad for x in xs] + [held]


@pytest.mark.parametrize("arch,ffn,kv,offload", [("gpt", 64, None, False), ("llama", 56, 1, False),
                                                 ("gpt", 64, None, True)])
@pytest.mark.parametrize("mixed", [False, True])
def test_lean_w_is_the_unsplit_backward_and_keeps_what_is_priced(arch: str, ffn: int, kv: int | None,
                                                                  offload: bool, mixed: bool) -> None:
    """Two blocks and the head, two microbatches, both I before either W: every gradient equals the plain
    backward's bitwise, and one microbatch keeps costmodel.deferred_w_bytes exactly (per Linear its input, one
    per shared norm output, and its output gradient, in the compute dtype); GPT at h = 16, s = 8, 2 samples:
    2 x 8 x (2 x 16 x 16 + 24 + 16) x b bytes, b the compute dtype's."""
    cfg = ModelConfig("m", arch, num_layers=2, hidden=16, num_heads=4, ffn_hidden=ffn, vocab_size=24, max_seq_len=8,
                      num_kv_heads=kv)
    torch.manual_seed(1)
    x0 = [torch.randn(2, 8, 16) for _ in range(2)]
    targets = torch.randint(0, 24, (2, 8))
    got = []
    for lean in (False, True):
        st = build_stage(cfg, (1, 4), 0)
        store = LeanW.install(st) if lean else None
        grads = _run(st, [x.clone().requires_grad_() for x in x0], targets, mixed, store, offload)
        got.append((grads, [p.grad for p in st.parameters()]))
    (gx_plain, w_plain), (gx_lean, w_lean) = got
    assert all(torch.equal(a, b) for a, b in zip(gx_plain[:-1] + w_plain, gx_lean[:-1] + w_lean))
    b = 2 if mixed else 4
    table = LayerTable(tuple(la.at_compute_bytes(b) for la in layer_list(cfg, 8)))
    assert gx_lean[-1] == deferred_w_bytes(table.range(1, 4), tp=1, dp=1, microbatch=2)
    if arch == "gpt":
        assert gx_lean[-1] == 2 * 8 * (2 * 16 * 16 + 24 + 16) * b


def test_one_recompute_per_backward_under_checkpointing() -> None:
    """A checkpointed block re-runs its forward once, inside I; W runs no forward (torch's split re-ran it once
    per parameter group). The gradients are the plain recomputing backward's."""
    cfg = ModelConfig("m", "gpt", num_layers=2, hidden=16, num_heads=2, ffn_hidden=32, vocab_size=24, max_seq_len=8)
    x0, g = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    grads = []
    for lean in (False, True):
        st = build_stage(cfg, (1, 3), 0, recompute=True)
        calls = [0]
        for layer in st.layers.values():
            layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        store = LeanW.install(st) if lean else None
        x = x0.clone().requires_grad_()
        y = st(x)
        if store is None:
            y.backward(g)
        else:
            kept = store.input_grads(y, g)
            assert calls[0] == 4 and len(kept) == 12  # the forward, then I's recompute; 6 Linears per GPT block
            LeanW.weight_grads(kept)
        assert calls[0] == 4
        grads.append([x.grad, *(p.grad for p in st.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


class _Shared(nn.Module):
    """A user's block: one Linear applied twice, a Linear subclass, a transposed (non-contiguous) input, a norm."""

    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 0.5

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = self.Scaled(8, 8)
        self.c = nn.Linear(6, 6, bias=False)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(F.gelu(self.a(self.norm(x))))
        h = self.b(h)
        return self.c(h.transpose(1, 2)).transpose(1, 2)


def test_a_user_modules_linears_and_what_stays_in_the_graph() -> None:
    """A Linear used twice has its two kept rows summed at W in backward order (as autograd's input buffer sums
    them); a Linear subclass and a non-contiguous input stay in the graph (their weights' gradients at I); a
    post-accumulate hook on a deferred weight fires at W, once per microbatch, as in the unsplit backward."""
    torch.manual_seed(2)
    x0, g = torch.randn(3, 6, 8), torch.randn(3, 6, 8)
    results = []
    for lean in (False, True):
        torch.manual_seed(3)
        m = _Shared()
        store = LeanW.install(m) if lean else None
        fired: list[str] = []
        m.a.weight.register_post_accumulate_grad_hook(lambda _: fired.append("a"))
        x = x0.clone().requires_grad_()
        y = m(x)
        if store is None:
            y.backward(g)
        else:
            kept = store.input_grads(y, g)
            assert [k.weight for k in kept] == [m.a.weight, m.a.weight] and fired == []
            assert m.b.weight.grad is not None and m.c.weight.grad is not None and m.a.weight.grad is None
            LeanW.weight_grads(kept)
        assert fired == ["a"]
        results.append([x.grad, *(p.grad for p in m.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_evaluation_runs_the_plain_linear_and_a_plain_backward_is_refused() -> None:
    """Without gradients a lean Linear is F.linear; a backward outside I would leave its weight without a gradient,
    so it raises, naming the step to use."""
    lin = nn.Linear(4, 4)
    store = LeanW.install(lin)
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        y = lin(x)
    assert y.grad_fn is None and torch.equal(y, F.linear(x, lin.weight, lin.bias))
    assert store.input_grads(lin(x.requires_grad_()).sum(), None)[0].weight is lin.weight
    with pytest.raises(RuntimeError, match=r"a chunk with the lean W \(hetauto.runtime.split_backward\) backprops "
                                           r"through LeanW.input_grads \(the I step\)"):
        lin(x).sum().backward()
