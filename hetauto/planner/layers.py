"""Per-layer costs of a decoder-only transformer: the numbers every planner and the simulator start from.

The layer list is `[embedding, block_0 .. block_{N-1}, head]` (the plan IR's layer indexing).

FLOPs count matrix multiplies only (norms, softmax and activations are < 1 % at these sizes), 2 FLOPs per
multiply-add, per token, forward: a block does `2 * (its matmul weights) + 4 * s * h` — the last term is
Q@K^T and scores@V over the full s x s matrix, as Megatron and Korthikanti count it (causal kernels skip
half of it). The head does `2 * V * h` (also when tied to the embedding); the embedding lookup does none.
Backward is 2x forward; with full recomputation the forward is run again, so backward costs 3x.

Activation memory per sample (microbatch b=1, bf16, s = sequence, h = hidden, a = heads, t = TP degree),
after Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models":

    no parallelism:                 s*h*(34 + 5*a*s/h)
    tensor parallel:                s*h*(10 + 24/t + 5*a*s/(h*t))
    tensor + sequence parallel:     s*h*(34/t + 5*a*s/(h*t))
    full recomputation:             2*s*h      (2*s*h/t with sequence parallelism)

The constants are split into a part TP cannot shard (10: two norm inputs, the attention and MLP inputs,
two dropout masks), a part it shards (24 = Q,K,V 6 + projection input 2 + MLP 16 for ffn = 4h) and the
attention scores (5*a*s: softmax output, dropout mask and output). We keep that split and derive it from
the architecture, so a GPT with ffn = 4h gives exactly the paper's numbers, while a Llama block (no
dropout, SwiGLU with three ffn-wide tensors, GQA's smaller K/V) gets the same accounting applied to its
tensors. `flash_attention=True` drops the a*s^2 score term (flash kernels keep only row statistics).

Precision: the byte counts above are for a 2-byte compute dtype (bf16/fp16, `LayerCost.compute_bytes`).
`LayerCost.at_compute_bytes(4)` re-expresses a layer for fp32 compute: every activation element in the compute
dtype doubles, while the parts whose size does not follow it stay (`fixed_*_bytes`: the 1-byte dropout masks,
the head's fp32 logits). Why a per-layer split and not one factor: at s = 32 the masks are a tenth of a GPT
block's activations, and the logits most of the head's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from hetauto.core.model import ModelConfig

LayerKind = Literal["embedding", "block", "head"]
BYTES_BF16 = 2


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Costs of one slot of the layer list at sequence length `seq_len`. Activation fields are bytes per
    sample (multiply by the microbatch) at tp=1; use `activation_bytes` for TP / SP / recompute variants."""

    index: int
    kind: LayerKind
    name: str
    params: int
    fwd_flops_per_token: float
    seq_len: int
    hidden: int
    act_replicated_bytes: float  # per sample; not sharded by TP (sharded by TP + sequence parallel)
    act_sharded_bytes: float  # per sample; sharded by TP
    act_score_bytes: float  # per sample; attention scores (sharded by TP, absent with flash attention)
    boundary_bytes_per_sample: float  # the activation sent to the next stage (in the compute dtype)
    # parameter tensors (weights, biases, norm scales): a per-tensor optimizer's step pays a fixed cost per
    # tensor, which on a CPU outweighs the bytes (calibration.Overheads.optim_tensor_s); TP does not change it
    param_tensors: int = 0
    # tensors the head holds of its own only on a stage without the embedding: its copy of a tied table (the
    # executor's split stages each keep one and sum their gradients); `param_tensors` counts it once, in the
    # embedding, as a stage holding both slots does
    tied_param_tensors: int = 0
    # and the elements of that copy (vocab x hidden): its parameters, gradients and optimizer states live on
    # the head stage too, and its gradient is summed with the embedding stage's every step
    tied_params: int = 0
    # bytes per element of the compute dtype the activation fields above are counted in (2: bf16/fp16)
    compute_bytes: int = BYTES_BF16
    # the parts of act_replicated/act_sharded/act_score that do not follow the compute dtype (1-byte dropout
    # masks, the fp32 logits): `at_compute_bytes` keeps them as they are
    fixed_replicated_bytes: float = 0.0
    fixed_sharded_bytes: float = 0.0
    fixed_score_bytes: float = 0.0
    # matmul weights (elements) whose 16-bit cast torch.autocast saves for backward under mixed precision (the
    # block's Linear weights, the head's projection, also a tied one; not the embedding lookup, norms or biases)
    matmul_params: int = 0
    # a stage builder model's slot that shares a parameter with this (later) slot, e.g. a head tied to the
    # embedding through the builder object: each stage builds its own slots, so a plan must keep both in one
    # stage (the reference models' tie is the executor's own, `tied_params` above, and splits freely)
    shares_with: int | None = None
    # what a zero-bubble schedule's microbatch keeps between its I and its W (bytes per sample at tp 1; the lean W,
    # hetauto.runtime.split_backward): per Linear its input and its output gradient, nothing else of the graph.
    # Output gradients: column-parallel matmuls' (Q, K, V, the MLP's first matmul(s), the vocab-parallel logits)
    # are sharded by TP, row-parallel ones' (the attention projection, the MLP's last matmul) whole on every TP
    # rank (their output is a partial sum). Inputs: a column-parallel matmul's is whole (the norm outputs, one
    # tensor shared by Q, K, V and by gate, up), a row-parallel one's sharded (the attention output, the MLP's
    # hidden). All in the compute dtype (the 16-bit casts the matmuls ran on under mixed precision). The norms'
    # weight gradients are computed at I, so none of theirs is kept.
    wgrad_sharded_bytes: float = 0.0
    wgrad_replicated_bytes: float = 0.0
    wgrad_input_sharded_bytes: float = 0.0
    wgrad_input_replicated_bytes: float = 0.0

    def at_compute_bytes(self, nbytes: int) -> "LayerCost":
        """This layer with its activations in a compute dtype of `nbytes` bytes per element (4: fp32): every
        element in the compute dtype scales, the fixed parts (masks, fp32 logits) stay."""
        if nbytes == self.compute_bytes:
            return self
        k = nbytes / self.compute_bytes

        def scaled(total: float, fixed: float) -> float:
            return fixed + (total - fixed) * k

        return replace(self, compute_bytes=nbytes,
                       act_replicated_bytes=scaled(self.act_replicated_bytes, self.fixed_replicated_bytes),
                       act_sharded_bytes=scaled(self.act_sharded_bytes, self.fixed_sharded_bytes),
                       act_score_bytes=scaled(self.act_score_bytes, self.fixed_score_bytes),
                       boundary_bytes_per_sample=self.boundary_bytes_per_sample * k,
                       wgrad_sharded_bytes=self.wgrad_sharded_bytes * k,
                       wgrad_replicated_bytes=self.wgrad_replicated_bytes * k,
                       wgrad_input_sharded_bytes=self.wgrad_input_sharded_bytes * k,
                       wgrad_input_replicated_bytes=self.wgrad_input_replicated_bytes * k)

    @property
    def fwd_flops_per_sample(self) -> float:
        return self.fwd_flops_per_token * self.seq_len

    def bwd_flops_per_token(self, recompute: bool = False) -> float:
        return (3.0 if recompute else 2.0) * self.fwd_flops_per_token

    def train_flops_per_token(self, recompute: bool = False) -> float:
        """Forward + backward: 3x forward, 4x with full recomputation."""
        return self.fwd_flops_per_token + self.bwd_flops_per_token(recompute)

    @property
    def act_bytes_per_sample(self) -> float:
        """Korthikanti, no parallelism, no recomputation: s*h*(34 + 5as/h) for a GPT block."""
        return self.act_replicated_bytes + self.act_sharded_bytes + self.act_score_bytes

    @property
    def act_bytes_per_sample_recompute(self) -> float:
        """Full recomputation keeps only the block input (s*h in the compute dtype); embedding and head keep their own."""
        if self.kind != "block":
            return self.act_bytes_per_sample
        return float(self.compute_bytes * self.seq_len * self.hidden)

    def activation_bytes(self, microbatch: int = 1, tp: int = 1, sequence_parallel: bool = False,
                         recompute: bool = False, flash_attention: bool = False) -> float:
        """Activation bytes this layer keeps for backward, per device, for one microbatch."""
        if recompute and self.kind == "block":
            per = self.compute_bytes * self.seq_len * self.hidden / (tp if sequence_parallel else 1)
        else:
            scores = 0.0 if flash_attention else self.act_score_bytes
            rep = self.act_replicated_bytes / (tp if sequence_parallel else 1)
            per = rep + (self.act_sharded_bytes + scores) / tp
        return microbatch * per


# ------------------------------------------------------------------------------------------- analytic
def block_params(m: ModelConfig) -> int:
    h, f, kv = m.hidden, m.ffn_hidden, m.kv_heads * m.head_dim
    if m.arch == "gpt":
        attn = h * (h + 2 * kv) + (h + 2 * kv) + h * h + h
        mlp = h * f + f + f * h + h
        norms = 2 * 2 * h
    else:
        attn = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if m.qkv_bias else 0)
        mlp = 3 * h * f
        norms = 2 * h
    return attn + mlp + norms


def block_param_tensors(m: ModelConfig) -> int:
    """Parameter tensors of one block of the reference implementation: GPT 16 (two LayerNorms' weight and
    bias, Q/K/V/output and two MLP Linears with biases), Llama 9 (two RMSNorm scales, seven bias-free Linears),
    plus 3 with q/k/v biases (qwen2)."""
    return 16 if m.arch == "gpt" else 9 + (3 if m.qkv_bias else 0)


def embedding_param_tensors(m: ModelConfig) -> int:
    """Token embedding, plus the learned positions of a GPT."""
    return 2 if m.arch == "gpt" else 1


def head_param_tensors(m: ModelConfig) -> int:
    """Final norm (weight and bias for GPT, a scale for Llama) plus the output projection unless tied (counted
    like `head_params`: a tied projection is the embedding's tensor; `tied_head_param_tensors` adds it back
    where the head sits apart from the embedding)."""
    return (2 if m.arch == "gpt" else 1) + (0 if m.tie_embeddings else 1)


def tied_head_param_tensors(m: ModelConfig) -> int:
    """The tied projection a head stage without the embedding holds of its own (1 when tied, else 0)."""
    return 1 if m.tie_embeddings else 0


def tied_head_params(m: ModelConfig) -> int:
    """Elements of that projection (vocab x hidden when tied, else 0)."""
    return m.vocab_size * m.hidden if m.tie_embeddings else 0


def _block_matmul_weights(m: ModelConfig) -> int:
    h, f, kv = m.hidden, m.ffn_hidden, m.kv_heads * m.head_dim
    mlp = (2 if m.arch == "gpt" else 3) * h * f
    return 2 * h * h + 2 * h * kv + mlp


def embedding_params(m: ModelConfig) -> int:
    pos = m.max_seq_len * m.hidden if m.arch == "gpt" else 0
    return m.vocab_size * m.hidden + pos


def head_params(m: ModelConfig) -> int:
    norm = 2 * m.hidden if m.arch == "gpt" else m.hidden
    return norm + (0 if m.tie_embeddings else m.vocab_size * m.hidden)


def total_params(m: ModelConfig) -> int:
    if m.builder is not None:  # the user's own model: counted from its modules (layers_from_builder)
        return sum(la.params for la in layers_from_builder(m.builder, m.max_seq_len))
    return embedding_params(m) + m.num_layers * block_params(m) + head_params(m)


def _block_activation_split(m: ModelConfig, s: int) -> tuple[float, float, float]:
    h, f, a = m.hidden, m.ffn_hidden, m.num_heads
    kv = m.kv_heads * m.head_dim
    if m.arch == "gpt":
        replicated = 10 * s * h  # 2 norm inputs (4) + attn & MLP inputs (4) + 2 dropout masks (2)
        sharded = 2 * s * h + 4 * s * kv + 2 * s * h + 4 * s * f + 0  # Q,K,V + proj input + fc1 out, GeLU out
        scores = 5 * a * s * s
    else:
        replicated = 8 * s * h  # no dropout
        sharded = 2 * s * h + 4 * s * kv + 2 * s * h + 8 * s * f  # gate, up, silu(gate), product
        scores = 2 * a * s * s  # softmax output only
    return float(replicated), float(sharded), float(scores)


def _block_fixed_bytes(m: ModelConfig, s: int) -> tuple[float, float]:
    """(replicated, score) bytes of a block that are 1-byte dropout masks (GPT: two s*h masks and one a*s*s;
    Llama: none), i.e. do not follow the compute dtype."""
    if m.arch == "gpt":
        return float(2 * s * m.hidden), float(m.num_heads * s * s)
    return 0.0, 0.0


def _block_wgrad_elements(m: ModelConfig, s: int) -> tuple[float, float, float, float]:
    """Elements per sample a deferred W keeps for one block: (sharded, replicated) output gradients, GPT Q, K, V +
    fc1 | proj + fc2, Llama Q, K, V + gate, up | o + down; then (sharded, replicated) Linear inputs, the attention
    output + the MLP's hidden (fc2's / down's input) | the two norm outputs (Q, K, V share one, fc1 / gate, up the
    other)."""
    h, kv, f = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden
    mlp_in = f * (1 if m.arch == "gpt" else 2)
    return float(s * (h + 2 * kv + mlp_in)), float(2 * s * h), float(s * (h + f)), float(2 * s * h)


def layer_list(model: ModelConfig, seq_len: int | None = None) -> tuple[LayerCost, ...]:
    """The analytic layer list of `model` at `seq_len` (default: the model's max_seq_len), activations in a
    2-byte compute dtype (`LayerCost.at_compute_bytes` for another)."""
    s = int(seq_len or model.max_seq_len)
    if s <= 0:
        raise ValueError(f"seq_len must be positive, got {s}")
    if model.builder is not None:
        return layers_from_builder(model.builder, s)
    h, v = model.hidden, model.vocab_size
    boundary = float(BYTES_BF16 * s * h)
    emb_act = float(s * h) if model.arch == "gpt" else 0.0  # embedding dropout mask (1 byte per element)
    layers = [LayerCost(0, "embedding", "embedding", embedding_params(model), 0.0, s, h, emb_act, 0.0, 0.0, boundary,
                        embedding_param_tensors(model), fixed_replicated_bytes=emb_act)]
    bp, bt = block_params(model), block_param_tensors(model)
    bflops = 2.0 * _block_matmul_weights(model) + 4.0 * s * h
    rep, sh, sc = _block_activation_split(model, s)
    fixed_rep, fixed_sc = _block_fixed_bytes(model, s)
    wg_sh, wg_rep, in_sh, in_rep = _block_wgrad_elements(model, s)
    for i in range(model.num_layers):
        layers.append(LayerCost(i + 1, "block", f"block_{i}", bp, bflops, s, h, rep, sh, sc, boundary, bt,
                                fixed_replicated_bytes=fixed_rep, fixed_score_bytes=fixed_sc,
                                matmul_params=_block_matmul_weights(model), wgrad_sharded_bytes=BYTES_BF16 * wg_sh,
                                wgrad_replicated_bytes=BYTES_BF16 * wg_rep, wgrad_input_sharded_bytes=BYTES_BF16 * in_sh,
                                wgrad_input_replicated_bytes=BYTES_BF16 * in_rep))
    # head: final-norm input and output (replicated), fp32 logits for the loss (sharded by vocab-parallel TP)
    logits = float(4 * s * v)
    layers.append(LayerCost(model.num_layers + 1, "head", "head", head_params(model), 2.0 * v * h, s, h,
                            float(4 * s * h), logits, 0.0, 0.0, head_param_tensors(model),
                            tied_head_param_tensors(model), tied_head_params(model), fixed_sharded_bytes=logits,
                            matmul_params=v * h, wgrad_sharded_bytes=float(BYTES_BF16 * s * v),
                            wgrad_input_replicated_bytes=float(BYTES_BF16 * s * h)))
    return tuple(layers)


def model_flops_per_token(model: ModelConfig, seq_len: int | None = None, recompute: bool = False) -> float:
    """Training FLOPs per token (forward + backward) over the whole layer list."""
    return sum(layer.train_flops_per_token(recompute) for layer in layer_list(model, seq_len))


# ------------------------------------------------------------------------------------------- from a module
def layers_from_module(module_factory: Callable[[], Any], seq_len: int,
                       example_input: Callable[[int], Any] | None = None) -> tuple[LayerCost, ...]:
    """Build the layer list from a live `torch.nn.Module`, built on the meta device (no weights, no memory).

    The blocks are the module's largest `nn.ModuleList`; parameters of `nn.Embedding`s outside it form the
    embedding slot and everything else the head. FLOPs come from `torch.utils.flop_counter.FlopCounterMode`
    on one forward of `example_input(seq_len)` (default: token ids of shape [1, seq_len]); activation bytes
    are the tensors autograd saves for backward, attributed to the block running when they were saved."""
    import torch

    module, blocks_name, blocks = _meta_module(module_factory)
    outside = _outside_params(module, blocks)
    x = example_input(seq_len) if example_input else torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    saved, counts = _traced_forward(module, blocks, x)
    n = len(blocks)
    total = sum(counts.get("Global", {}).values())
    prefix = next((k for k in counts if k.endswith(f".{blocks_name}.0") or k == f"{blocks_name}.0"), None)
    block_flops = []
    for i in range(n):
        key = f"{prefix[: -2]}.{i}" if prefix else None
        block_flops.append(float(sum(counts.get(key, {}).values())) if key else 0.0)
    head_flops = float(total) - sum(block_flops)
    h = _hidden_of(blocks[0])
    boundary = float(BYTES_BF16 * seq_len * h) if h else 0.0
    out = [LayerCost(0, "embedding", "embedding", outside.emb_params, 0.0, seq_len, h, saved[0], 0.0, 0.0, boundary,
                     outside.emb_tensors)]
    for i, blk in enumerate(blocks):
        out.append(LayerCost(i + 1, "block", f"block_{i}", sum(p.numel() for p in blk.parameters()),
                             block_flops[i] / seq_len, seq_len, h, 0.0, saved[i + 1], 0.0, boundary,
                             len(list(blk.parameters()))))
    out.append(LayerCost(n + 1, "head", "head", outside.head_params, head_flops / seq_len, seq_len, h,
                         0.0, saved[n + 1], 0.0, 0.0, outside.head_tensors, outside.tied_tensors, outside.tied_elems))
    return tuple(out)


def _meta_module(module_factory: Callable[[], Any]) -> tuple[Any, str, Any]:
    """(the module built on the meta device, its block list's name, the block list): the largest non-empty
    `nn.ModuleList` by parameters, where hetauto splits the model."""
    import torch
    from torch import nn

    with torch.device("meta"):
        module = module_factory()
    if not isinstance(module, nn.Module):
        raise TypeError(f"module_factory must return a torch.nn.Module, got {type(module).__name__}")
    lists = [(name, ml) for name, ml in module.named_modules() if isinstance(ml, nn.ModuleList) and len(ml) > 0]
    if not lists:
        raise ValueError("the module has no nn.ModuleList of blocks; hetauto splits models at their block list")
    blocks_name, blocks = max(lists, key=lambda item: sum(p.numel() for p in item[1].parameters()))
    return module, blocks_name, blocks


@dataclass(frozen=True, slots=True)
class _OutsideParams:
    """The parameters outside the block list: the embedding slot's (nn.Embedding tables), the head's (the rest),
    and the head-side tensors tied to the embedding (counted once, in the embedding)."""

    emb_params: int
    emb_tensors: int
    head_params: int
    head_tensors: int
    tied_tensors: int
    tied_elems: int


def _outside_params(module: Any, blocks: Any) -> _OutsideParams:
    """Count the embedding's and the head's parameters and tensors, tied weights once (in the embedding)."""
    from torch import nn

    in_blocks = {id(p) for p in blocks.parameters()}
    emb_ids: set[int] = set()
    for sub in module.modules():
        if isinstance(sub, nn.Embedding):
            emb_ids.update(id(p) for p in sub.parameters() if id(p) not in in_blocks)
    # head-side tensors shared with the embedding (a tied table): counted once, in the embedding, and again
    # for a head stage apart from it
    head_side = {id(p) for sub in module.modules() if not isinstance(sub, nn.Embedding)
                 for p in sub.parameters(recurse=False)}
    tied = head_side & emb_ids
    tied_elems = sum(p.numel() for p in module.parameters() if id(p) in tied)
    seen: set[int] = set()
    emb_params = head_params = emb_tensors = head_tensors = 0
    for p in module.parameters():  # deduplicated: tied weights count once, in the embedding
        if id(p) in seen or id(p) in in_blocks:
            continue
        seen.add(id(p))
        if id(p) in emb_ids:
            emb_params += p.numel()
            emb_tensors += 1
        else:
            head_params += p.numel()
            head_tensors += 1
    return _OutsideParams(emb_params, emb_tensors, head_params, head_tensors, len(tied), tied_elems)


def _traced_forward(module: Any, blocks: Any, x: Any) -> tuple[list[float], dict[str, Any]]:
    """One forward of `x` on the meta device: (bytes autograd saves for backward per slot, embedding, each block,
    head, weights left out; the FLOP counter's counts per module)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    n = len(blocks)
    saved = [0.0] * (n + 2)
    current = [0]

    def enter(i: int) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            current[0] = i + 1
        return hook

    def leave(i: int) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            current[0] = n + 1 if i == n - 1 else i + 2
        return hook

    handles = []
    for i, blk in enumerate(blocks):
        handles.append(blk.register_forward_pre_hook(enter(i)))
        handles.append(blk.register_forward_hook(leave(i)))
    seen_saved: set[int] = set()
    param_ids = {id(p) for p in module.parameters()}

    def is_weight(t: Any) -> bool:
        while t is not None:
            if id(t) in param_ids:
                return True
            t = t._base
        return False

    def pack(t: Any) -> Any:
        key = id(t)
        if isinstance(t, torch.Tensor) and key not in seen_saved and not is_weight(t):
            seen_saved.add(key)
            saved[current[0]] += t.numel() * t.element_size()
        return t

    counter = FlopCounterMode(display=False)
    try:
        with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(x)
    finally:
        for hd in handles:
            hd.remove()
    return saved, counter.get_flop_counts()


def _hidden_of(block: Any) -> int:
    """The block's model width: the input size of its first Linear (what flows between blocks)."""
    from torch import nn

    for sub in block.modules():
        if isinstance(sub, nn.Linear):
            return int(sub.in_features)
    return 0


# ------------------------------------------------------------------------------------------- from a stage builder
@functools.lru_cache(maxsize=64)
def layers_from_builder(ref: str, seq_len: int) -> tuple[LayerCost, ...]:
    """The layer list of a stage builder model (hetauto.core.user_model), each slot built alone on the meta
    device (no weights, no memory) and run once on a [1, seq_len] sample.

    Counted, not modelled: `params` and `param_tensors` are the slot module's parameters; `fwd_flops_per_token`
    is what torch.utils.flop_counter.FlopCounterMode counts for the slot's forward (matmuls, einsums,
    convolutions and attention kernels at 2 FLOPs per multiply-add; elementwise ops and norms count 0, as in
    `layer_list`) divided by seq_len; backward is 2x forward as for every layer. Activations are the tensors
    autograd saves for backward in that forward (fp32 on meta, so `compute_bytes` is 4 and
    `LayerCost.at_compute_bytes` re-expresses them for a 16-bit run), kept as not sharded: a builder model runs
    at tp 1. `matmul_params` are the slot's parameters of 2 or more dimensions outside nn.Embedding tables. The
    W set (`wgrad_*`, what a zero-bubble schedule's deferred W keeps) is each plain nn.Linear call's input and
    output in that forward, as the lean W keeps them (whole: tp 1)."""
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    from hetauto.core.errors import SpecError
    from hetauto.core.user_model import load_builder

    b = load_builder(ref)
    n, h, s = b.num_blocks, b.hidden, int(seq_len)
    if s > b.max_seq_len:
        raise ValueError(f"seq_len {s} exceeds {ref}'s max_seq_len {b.max_seq_len}")
    with torch.device("meta"):
        slots = [b.embedding(), *(b.block(i) for i in range(n)), b.head()]
    x: Any = torch.zeros(1, s, dtype=torch.long, device="meta")
    out = []
    owner: dict[int, int] = {}  # id of a parameter -> the first slot holding it (the slots stay alive: ids stay)
    for i, mod in enumerate(slots):
        what = "embedding()" if i == 0 else "head()" if i == n + 1 else f"block({i - 1})"
        if not isinstance(mod, nn.Module):
            raise SpecError(None, "model", f"{ref}: {what} returned a {type(mod).__name__}, not an nn.Module",
                            "each factory of the stage builder returns a torch.nn.Module")
        params = list(mod.parameters())
        ids = {id(p) for p in params}
        shares = min((owner[k] for k in ids if k in owner), default=None)
        for k in ids:
            owner.setdefault(k, i)
        # a parameter shared with an earlier slot is counted there: a stage holds one copy (the plan keeps both
        # slots in one stage), so its states are not priced twice; its matmul use here is still cast (below)
        own = [p for p in params if owner[id(p)] == i]
        saved = [0.0]
        seen: set[int] = set()

        def pack(t: Any, ids: set[int] = ids, saved: list[float] = saved, seen: set[int] = seen) -> Any:
            base = t
            while base._base is not None:
                base = base._base
            if id(t) not in seen and id(base) not in ids:
                seen.add(id(t))
                saved[0] += t.numel() * t.element_size()
            return t

        counter = FlopCounterMode(display=False)
        w_set, hooks = _w_set_counter(mod)
        try:
            with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                x = mod(x)
        except Exception as err:  # the user's forward: one line, not a traceback from inside it
            raise SpecError(None, "model", f"{ref}: {what}'s forward on a [1, {s}] sample on the meta device "
                            f"failed: {type(err).__name__}: {err}",
                            "the planner counts it on meta tensors: no .item(), .cpu() or tensors made on a device "
                            "in forward") from None
        finally:
            for hk in hooks:
                hk.remove()
        kind: LayerKind = "embedding" if i == 0 else "head" if i == n + 1 else "block"
        matmul = 0 if i == 0 else sum(p.numel() for sub in mod.modules() if not isinstance(sub, nn.Embedding)
                                      for p in sub.parameters(recurse=False) if p.dim() >= 2)
        out.append(LayerCost(i, kind, kind if kind != "block" else f"block_{i - 1}", sum(p.numel() for p in own),
                             float(counter.get_total_flops()) / s, s, h, saved[0], 0.0, 0.0,
                             0.0 if kind == "head" else float(4 * s * h), len(own), compute_bytes=4,
                             matmul_params=matmul, shares_with=shares, wgrad_replicated_bytes=w_set[1],
                             wgrad_input_replicated_bytes=w_set[0]))
    return tuple(out)


def _w_set_counter(mod: Any) -> tuple[list[float], list[Any]]:
    """Forward hooks counting what the lean W keeps of `mod` per sample (hetauto.runtime.split_backward): per
    plain nn.Linear call on a contiguous input of >= 2 dims, its output's bytes (the output gradient) and its
    input's, each input tensor once (Linears sharing one keep one copy). [input bytes, output bytes], filled as the
    forward runs; the hooks to remove after it."""
    from torch import nn

    counts = [0.0, 0.0]
    inputs: list[Any] = []  # alive until the forward ends: ids stay unique

    def on_linear(sub: Any, args: tuple[Any, ...], y: Any) -> None:
        xin = args[0] if args else None
        if xin is None or xin.dim() < 2 or not xin.is_contiguous() or not sub.weight.requires_grad:
            return
        if not any(xin is t for t in inputs):
            inputs.append(xin)
            counts[0] += float(xin.numel() * xin.element_size())
        counts[1] += float(y.numel() * y.element_size())

    return counts, [sub.register_forward_hook(on_linear) for sub in mod.modules() if type(sub) is nn.Linear]
