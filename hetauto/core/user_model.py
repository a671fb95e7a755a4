"""Your own model: the stage builder protocol, and where a plan names one ("pkg.module:NAME").

Why a builder of layer slots and not a whole `nn.Module`: hetauto plans and runs a model as its layer list
`[embedding, block_0 .. block_{N-1}, head]` (the plan IR's indexing). A builder that makes one slot at a
time lets each rank build only the slots its stage owns, lets the planner count each slot's parameters and
FLOPs on the meta device (no memory), and makes every slot's initial weights a function of (seed, slot)
alone: the runtime calls the slot's factory under a torch RNG seeded by (seed, slot), so any partition of
the model into stages equals the single-process model (hetauto.runtime.user_model).

The protocol is as small as torchtitan's model protocol (a config that builds the model, its own weight
initialisation, and a way to count parameters and FLOPs; torchtitan/protocols/model.py), cut at slots
instead of one module that pipelining later splits by deleting submodules:

    class MyModel:                       # any object with these attributes, or a zero-argument callable
        vocab_size: int                  #   (e.g. a class) that returns one
        hidden: int                      # width of the activations between stages: [batch, seq, hidden]
        num_blocks: int
        max_seq_len: int
        def embedding(self) -> nn.Module:       # token ids [b, s] int64 -> [b, s, hidden]
        def block(self, i: int) -> nn.Module:   # [b, s, hidden] -> [b, s, hidden], i in 0..num_blocks-1
        def head(self) -> nn.Module:            # [b, s, hidden] -> logits [b, s, vocab_size]

The loss is next-token cross-entropy on the head's logits (as for the reference GPT/LLaMA). A module's own
constructor initialises its weights (PyTorch's `reset_parameters`, or anything it draws from torch's RNG).
What the reference models have and a builder model has not: tensor parallelism (plans keep tp 1), tied
embedding/head weights, and `--init-from` / Hugging Face export.

A plan names the builder in its `model` field, e.g. `"model": "examples.causal_mixer:CausalMixer"`;
`hetauto plan --model examples.causal_mixer:CausalMixer ...` writes it there and `hetauto run --model-code
examples.causal_mixer` reads it back. The module is imported from the working directory or PYTHONPATH. This
module imports no torch: the user's module does, when it is loaded.

A plan or cluster file is data a user may be handed, like a checkpoint, so a string inside one never imports
anything (`"model": "os:abort"` must not run `os.abort`): a module is imported only when it was allowed
explicitly, by `allow_model_code` (the CLI's `--model-code MODULE`, or a `--model pkg.module:NAME` typed on the
command line), by `HETAUTO_MODEL_CODE` (comma-separated; `allow_model_code` sets it, so the job's workers
inherit the choice), or by an installed distribution's `hetauto.models` entry point naming it.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from typing import Any, Protocol

from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig

__all__ = ["StageBuilder", "is_builder_ref", "load_builder", "builder_model_config", "allow_model_code",
           "model_code_allowed", "MODEL_CODE_ENV", "ENTRY_POINT_GROUP"]

MODEL_CODE_ENV = "HETAUTO_MODEL_CODE"  # comma-separated modules (or packages) whose model code may be imported
ENTRY_POINT_GROUP = "hetauto.models"  # installed models: `name = "pkg.module:NAME"`

_REF = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_INTS = ("vocab_size", "hidden", "num_blocks", "max_seq_len")
_FACTORIES = ("embedding", "block", "head")


class StageBuilder(Protocol):
    """What `pkg.module:NAME` must be (or return when called with no arguments); see the module docstring."""

    vocab_size: int
    hidden: int
    num_blocks: int
    max_seq_len: int

    def embedding(self) -> Any: ...

    def block(self, i: int) -> Any: ...

    def head(self) -> Any: ...


def _allowed_here() -> set[str]:
    return {m.strip() for m in os.environ.get(MODEL_CODE_ENV, "").split(",") if m.strip()}


def allow_model_code(*modules: str) -> None:
    """Allow importing model code from these modules (or packages) in this process and the processes it starts
    (through `HETAUTO_MODEL_CODE`): the explicit choice a plan file can never make."""
    mods = _allowed_here()
    for m in modules:
        m = m.strip()
        if not re.match(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$", m):
            raise SpecError(None, "--model-code", f"'{m}' is not a module name", "write it as pkg.module")
        mods.add(m)
    os.environ[MODEL_CODE_ENV] = ",".join(sorted(mods))


@functools.lru_cache(maxsize=1)
def _entry_point_modules() -> frozenset[str]:
    from importlib.metadata import entry_points

    try:
        return frozenset(str(ep.value).split(":", 1)[0].strip() for ep in entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # noqa: BLE001 - a broken distribution's metadata allows nothing
        return frozenset()


def model_code_allowed(module_name: str) -> bool:
    """Whether `module_name` was allowed (`allow_model_code`, HETAUTO_MODEL_CODE, an installed entry point)."""
    allowed = _allowed_here() | _entry_point_modules()
    return any(module_name == m or module_name.startswith(m + ".") for m in allowed)


def is_builder_ref(value: str) -> bool:
    """Whether a model reference is "pkg.module:NAME" (not a catalog name or a config.json path)."""
    return bool(_REF.match(str(value).strip()))


@functools.lru_cache(maxsize=None)
def load_builder(ref: str) -> StageBuilder:
    """Import `pkg.module`, take NAME (calling it when it is a class or factory), and check the protocol;
    every problem is one SpecError naming the reference and the fix."""
    ref = ref.strip()
    if not is_builder_ref(ref):
        raise SpecError(None, "model", f"'{ref}' is not a stage builder reference", "write it as pkg.module:NAME")
    module_name, attr = ref.split(":")
    if not model_code_allowed(module_name):
        raise SpecError(None, "model", f"'{ref}' would import module '{module_name}', and a plan or cluster file "
                        "never runs code", f"if you trust it, pass --model-code {module_name}, or install it with "
                        f"a '{ENTRY_POINT_GROUP}' entry point")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` does: a module beside the job's files imports
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise SpecError(None, "model", f"cannot import '{module_name}' for '{ref}': {err}",
                        "run from the folder that holds it, or put that folder on PYTHONPATH") from None
    if not hasattr(module, attr):
        raise SpecError(None, "model", f"module '{module_name}' has no '{attr}'", "name the builder defined there")
    obj = getattr(module, attr)
    if isinstance(obj, type) or (callable(obj) and not all(hasattr(obj, n) for n in _FACTORIES)):
        obj = obj()
    missing = [n for n in (*_INTS, *_FACTORIES) if not hasattr(obj, n)]
    if missing:
        raise SpecError(None, "model", f"'{ref}' lacks {', '.join(missing)} of the stage builder protocol",
                        "the protocol is vocab_size, hidden, num_blocks, max_seq_len, embedding(), block(i), "
                        "head(): hetauto.core.user_model")
    for n in _INTS:
        v = getattr(obj, n)
        if isinstance(v, bool) or not isinstance(v, int) or v < (2 if n == "vocab_size" else 1):
            raise SpecError(None, "model", f"'{ref}'.{n} must be a positive integer, got {v!r}")
    for n in _FACTORIES:
        if not callable(getattr(obj, n)):
            raise SpecError(None, "model", f"'{ref}'.{n} must be a method that returns an nn.Module")
    return obj


def builder_model_config(ref: str) -> ModelConfig:
    """The ModelConfig of the builder `ref`: named by the reference itself (so a plan written from it names
    it again), arch "custom"; heads and ffn width have no meaning for it (set to 1 and `hidden`)."""
    ref = ref.strip()
    b = load_builder(ref)
    return ModelConfig(name=ref, arch="custom", num_layers=b.num_blocks, hidden=b.hidden, num_heads=1,
                       ffn_hidden=b.hidden, vocab_size=b.vocab_size, max_seq_len=b.max_seq_len, builder=ref)
