"""`RunOptions`: everything a launched rank needs to know besides the plan, in one frozen value.

Why: the launcher decides (steps, seed, emulation, each stage's backend, checkpoints, faults) and the
workers obey; writing that decision once as JSON into the run folder (`run.json`) and reading it back in
every rank replaces a dozen command-line flags threaded through the launcher, the namespace launcher and
the worker, and lets a multi-node launch hand every node the same file. Plain JSON, never pickle; an
unknown or missing key is refused with the file and the key named.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from hetauto.core.errors import SpecError

__all__ = ["RunOptions", "EMULATION_MODES"]

EMULATION_MODES = ("none", "inprocess", "speed-only")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """`emulate`: "none" (real devices and links), "inprocess" (each cluster at its speed factor, its links
    emulated in-process), "speed-only" (speed factors; the links are real, e.g. network namespaces).
    `backends`: each stage's backend name, as the launcher resolved it (empty: cpu everywhere)."""

    plan: str
    out: str
    steps: int = 3
    seed: int = 0
    lr: float = 1e-3
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    clip_grad: float | None = None
    data: str | None = None  # a token file (hetauto.runtime.token_data); None: the synthetic stream
    init_from: str | None = None  # a Hugging Face checkpoint folder (hetauto.runtime.hf_weights)
    eval_every: int | None = None  # evaluate the held-out loss every K steps and after the last
    eval_steps: int = 1
    eval_fraction: float = 0.05
    weight_decay: float = 0.01  # AdamW's (hetauto.runtime.reference.ADAMW_WEIGHT_DECAY)
    timeout_s: float = 60.0
    emulate: Literal["none", "inprocess", "speed-only"] = "none"
    cluster_base: str | None = None
    backends: tuple[str, ...] = ()
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    keep: int | None = None
    resume: str | None = None
    allow_data_change: bool = False
    inject_fault: str | None = None
    data_column: str | None = None  # a datasets folder's token-id column (hetauto.runtime.hf_dataset)
    on_nonfinite: Literal["stop", "skip", "continue"] = "stop"  # hetauto.runtime.nonfinite

    def __post_init__(self) -> None:
        if self.emulate not in EMULATION_MODES:
            raise ValueError(f"emulate must be one of {', '.join(EMULATION_MODES)}, got {self.emulate!r}")
        if self.on_nonfinite not in ("stop", "skip", "continue"):
            raise ValueError(f"on_nonfinite must be stop, skip or continue, got {self.on_nonfinite!r}")
        object.__setattr__(self, "backends", tuple(self.backends))

    @property
    def emulated(self) -> bool:
        return self.emulate != "none"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.to_json() + "\n", encoding="utf-8")
        return p

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> "RunOptions":
        if not isinstance(data, dict):
            raise SpecError(source, "(top level)", "run options must be a JSON object")
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise SpecError(source, str(key), "unknown field", f"expected one of: {', '.join(sorted(known))}")
        for key in ("plan", "out"):
            if key not in data:
                raise SpecError(source, key, "required field is missing", "the launcher writes it")
        try:
            return cls(**data)
        except (TypeError, ValueError) as err:
            raise SpecError(source, "(top level)", str(err)) from None

    @classmethod
    def load(cls, path: str | Path) -> "RunOptions":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as err:
            raise SpecError(str(path), "(file)", f"cannot read run options: {err.strerror or err}") from None
        except json.JSONDecodeError as err:
            raise SpecError(str(path), f"line {err.lineno}", f"invalid JSON: {err.msg}") from None
        return cls.from_dict(data, str(path))
