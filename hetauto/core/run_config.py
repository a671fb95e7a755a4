"""`RunConfig`: one run's configuration, one frozen, self-checking tree that the CLI, the launch plan and every rank
read (`"schema": "hetauto.run/1"`).

Why one tree: the launcher decides (steps, seed, learning rate, data, checkpoints, emulation, faults) and the ranks
obey; the decision used to be copied by hand from the flags into a flat options class, from it into the executor's
and the checkpointer's own classes and into the reference's parameters, so a new training knob touched six files.
Here each knob is one field of its section (like torchtitan's `config/job_config.py`) that carries its one-line
doc and, when it is a flag, the flag, its help text and its CLI default (`hetauto.core.run_config_cli` builds the
argparse arguments from them and reads them back); a new knob is that field and its use.

Plain JSON, never pickle: an unknown or missing key is refused with the file and the key named. A document without
`schema` is the flat form the launch plan `hetauto.launch/1` and older run folders carry (each field's old flat
name, `flat_name`), read into the same tree. Value checks that need no file live in the sections' `__post_init__`s
and name the field (`training.steps`); checks against files (the plan, the data, a checkpoint) are the launcher's.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterator, Literal

from hetauto.core.errors import SpecError

__all__ = ["RUN_SCHEMA", "EMULATION_MODES", "LR_SCHEDULES", "NONFINITE_POLICIES", "TrainingConfig", "DataConfig",
           "CheckpointConfig", "EmulationConfig", "FaultsConfig", "IslandConfig", "RunConfig", "knob", "Knob", "knobs"]

RUN_SCHEMA = "hetauto.run/1"
EMULATION_MODES = ("none", "inprocess", "speed-only")
LR_SCHEDULES = ("constant", "cosine", "linear")
NONFINITE_POLICIES = ("stop", "skip", "continue")


def knob(default: Any, doc: str, *, flag: str | None = None, group: str | None = None, flat: str | None = None,
         cli_default: Any = MISSING, path: bool = False, **argparse_kw: Any) -> Any:
    """A field of a section: its default, its one-line `doc` (the flag's help text when it is a flag), and for a
    flag its name, argparse `group` (None: the parser itself), the argparse default when it differs from the
    field's (`cli_default`: e.g. None meaning "decided later"), whether it is a path (made absolute for the ranks)
    and argparse's own keywords (type, metavar, choices, action). `flat`: the field's name in the flat form."""
    meta = {"doc": doc, "flag": flag, "group": group, "flat": flat, "path": path, "argparse": argparse_kw,
            "cli_default": default if cli_default is MISSING else cli_default}
    return field(default=default, metadata=meta)


def _fail(name: str, problem: str) -> None:
    raise SpecError(None, name, problem)


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    """What one step trains and how the optimizer steps."""

    steps: int = knob(3, "training steps (default 3)", flag="--steps", type=int)
    seed: int = knob(0, "model initialisation and synthetic data seed (default 0; with --resume: the checkpoint's)",
                     flag="--seed", type=int, cli_default=None)
    timeout_s: float = knob(60.0, "seconds any one communication may take (joining the job waits at least 30 s: its "
                                  "ranks start seconds apart)", flag="--timeout", type=float)
    lr: float = knob(1e-3, "peak learning rate (default 1e-3)", flag="--lr", group="training", type=float)
    lr_schedule: Literal["constant", "cosine", "linear"] = knob(
        "constant", "after the warm-up: constant (default), or decay towards --min-lr, reached one step after the last",
        flag="--lr-schedule", group="training", choices=LR_SCHEDULES)
    warmup_steps: int = knob(0, "linear warm-up steps (default 0)", flag="--warmup-steps", group="training", type=int)
    min_lr: float = knob(0.0, "the learning rate the decay ends at (default 0)", flag="--min-lr", group="training",
                         type=float)
    weight_decay: float = knob(0.01, "AdamW's decoupled weight decay (default 0.01)", flag="--weight-decay",
                               group="training", type=float)
    clip_grad: float | None = knob(None, "clip gradients to this global norm (over every stage, TP shard and DP "
                                         "replica)", flag="--clip-grad", group="training", type=float, metavar="NORM")
    on_nonfinite: Literal["stop", "skip", "continue"] = knob(
        "stop", "a nan/inf loss or gradient: stop the run before the weights take it (default), skip that optimizer "
                "step, or continue; no checkpoint with nan/inf weights is ever written",
        flag="--on-nonfinite", group="training", choices=NONFINITE_POLICIES)

    def __post_init__(self) -> None:
        if self.steps < 1:
            _fail("training.steps", f"must be >= 1, got {self.steps}")
        if not self.timeout_s > 0:
            _fail("training.timeout_s", f"must be > 0 seconds, got {self.timeout_s}")
        if not math.isfinite(self.lr):
            _fail("training.lr", f"must be a finite number, got {self.lr}")
        if not self.lr > 0:
            _fail("training.lr", f"must be > 0, got {self.lr}")
        if self.lr_schedule not in LR_SCHEDULES:
            _fail("training.lr_schedule", f"must be constant, cosine or linear, got {self.lr_schedule!r}")
        if self.warmup_steps < 0:
            _fail("training.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr <= self.lr:
            _fail("training.min_lr", f"must be between 0 and training.lr ({self.lr:g}), got {self.min_lr:g}")
        if not 0 <= self.weight_decay < math.inf:
            _fail("training.weight_decay", f"must be >= 0, got {self.weight_decay}")
        if self.clip_grad is not None and not self.clip_grad > 0:
            _fail("training.clip_grad", f"must be > 0, got {self.clip_grad}")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            _fail("training.on_nonfinite", f"must be stop, skip or continue, got {self.on_nonfinite!r}")


@dataclass(frozen=True, slots=True)
class DataConfig:
    """Where the batches come from, and the held-out evaluation."""

    path: str | None = knob(None, "train on a local token file (hetauto data prepare) or a Hugging Face datasets "
                                  "folder (save_to_disk); default: the synthetic stream",
                            flag="--data", group="training", flat="data", path=True, metavar="FILE.bin|DIR")
    column: str | None = knob(None, "with a datasets folder as --data: the column of token ids (default input_ids)",
                              flag="--data-column", group="training", flat="data_column", metavar="NAME")
    eval_every: int | None = knob(None, "evaluate the held-out loss after every K steps and after the last",
                                  flag="--eval-every", group="training", type=int, metavar="K")
    eval_steps: int = knob(1, "held-out global batches per evaluation", flag="--eval-steps", group="training",
                           type=int, metavar="N")
    eval_fraction: float = knob(0.05, "with --data and --eval-every: the token file's tail held out for evaluation "
                                      "(default 0.05)", flag="--eval-fraction", group="training", type=float,
                                metavar="F")

    def __post_init__(self) -> None:
        if self.eval_every is not None and self.eval_every < 1:
            _fail("data.eval_every", f"must be >= 1, got {self.eval_every}")
        if self.eval_steps < 1:
            _fail("data.eval_steps", f"must be >= 1, got {self.eval_steps}")
        if not 0 < self.eval_fraction < 1:
            _fail("data.eval_fraction", f"must be between 0 and 1, got {self.eval_fraction}")

    @property
    def held_out_fraction(self) -> float:
        """The share of the data held out: `eval_fraction` when evaluating, else none."""
        return self.eval_fraction if self.eval_every else 0.0


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """Weights in (published weights, a checkpoint to resume) and checkpoints out."""

    init_from: str | None = knob(None, "start from a local Hugging Face checkpoint (config.json + *.safetensors; "
                                       "llama, mistral, gpt2)", flag="--init-from", group="training", path=True,
                                 metavar="DIR")
    dir: str | None = knob(None, "write sharded checkpoints under D (step-XXXXXXXX folders)", flag="--checkpoint-dir",
                           group="checkpoints and failures", flat="checkpoint_dir", path=True, metavar="D")
    every: int = knob(1, "checkpoint every K steps and after the last one (default 1)", flag="--checkpoint-every",
                      group="checkpoints and failures", flat="checkpoint_every", type=int, metavar="K")
    keep: int | None = knob(None, "keep only the newest N checkpoints", flag="--keep",
                            group="checkpoints and failures", type=int, metavar="N")
    resume: str | None = knob(None, "continue from a checkpoint (a step folder, or a --checkpoint-dir: its latest); "
                                    "--steps counts from step 0, so the run trains the steps after the checkpoint's",
                              flag="--resume", group="checkpoints and failures", path=True, metavar="D")
    allow_data_change: bool = knob(False, "with --resume: continue even though the plan's global batch or sequence "
                                          "length differs from the checkpoint's (the data stream changes; the run no "
                                          "longer continues the checkpoint's run bit for bit)",
                                   flag="--allow-data-change", group="checkpoints and failures", action="store_true")

    def __post_init__(self) -> None:
        if self.every < 1:
            _fail("checkpoint.every", f"must be >= 1, got {self.every}")
        if self.keep is not None and self.keep < 1:
            _fail("checkpoint.keep", f"must be >= 1, got {self.keep}")


@dataclass(frozen=True, slots=True)
class EmulationConfig:
    """How the plan's clusters are emulated on this machine, and each stage's backend."""

    mode: Literal["none", "inprocess", "speed-only"] = knob(
        "none", "none (real devices and links), inprocess (each cluster at its speed factor, its links emulated "
                "in-process) or speed-only (speed factors; the links are real, e.g. network namespaces)",
        flat="emulate")
    cluster_base: str | None = knob(None, "the folder the plan's cluster file is read relative to")
    backends: tuple[str, ...] = knob((), "each stage's backend name, as the launcher resolved it (empty: cpu "
                                         "everywhere)")

    def __post_init__(self) -> None:
        if self.mode not in EMULATION_MODES:
            _fail("emulation.mode", f"must be one of {', '.join(EMULATION_MODES)}, got {self.mode!r}")
        object.__setattr__(self, "backends", tuple(self.backends))

    @property
    def emulated(self) -> bool:
        return self.mode != "none"


@dataclass(frozen=True, slots=True)
class FaultsConfig:
    """Failures injected on purpose (tests, drills)."""

    inject: str | None = knob(None, "rank=R,step=S[,phase=step|checkpoint]"
                                    "[,action=exit|hang|sigkill|sigbus|emfile|oom]: kill (or stall, or fail with a "
                                    "real SIGKILL, SIGBUS, EMFILE or OOM kill) rank R at step S (first attempt only)", flag="--inject-fault",
                              group="checkpoints and failures", flat="inject_fault", metavar="SPEC")


@dataclass(frozen=True, slots=True)
class IslandConfig:
    """This run's island of an island plan (hetauto.core.islands): the run's own plan is that island's plan; the
    outer sync with the other islands goes through the store at `store`. Empty for an ordinary plan."""

    plan: str | None = knob(None, "the island plan (hetauto.plan/2) whose island this run trains", flat="island_plan",
                            path=True)
    index: int = knob(0, "this run's island: its index in the island plan's islands", flat="island_index")
    store: str | None = knob(None, "HOST:PORT of the outer sync's store (served by rank 0 of island 0)",
                             flat="island_store")

    def __post_init__(self) -> None:
        if self.index < 0:
            _fail("island.index", f"must be >= 0, got {self.index}")
        if self.plan is not None and not self.store:
            _fail("island.store", "an island run needs the outer sync's store (HOST:PORT)")

    @property
    def active(self) -> bool:
        return self.plan is not None


SECTIONS: dict[str, type] = {"training": TrainingConfig, "data": DataConfig, "checkpoint": CheckpointConfig,
                             "emulation": EmulationConfig, "faults": FaultsConfig,
                             "island": IslandConfig}


@dataclass(frozen=True, slots=True)
class Knob:
    """One field of the tree, as the CLI and the flat form see it."""

    section: str
    name: str
    meta: Any  # the field's metadata (see `knob`)

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def flat(self) -> str:
        return self.meta["flat"] or self.name


def knobs() -> Iterator[Knob]:
    """Every field of every section, in declaration order."""
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            yield Knob(section, f.name, f.metadata)


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything a launched rank needs to know besides the plan: `plan` and `out` are the plan file and the run
    folder each rank reads and writes (set per machine by the launcher; empty inside a launch plan). A field is
    read through its section (`run.training.steps`, `run.checkpoint.dir`); the flat names are only a way in
    (`from_flat`, the flat form), so a read by one (`run.steps`) is an AttributeError, not a silent guess."""

    plan: str = ""
    out: str = ""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    island: IslandConfig = field(default_factory=IslandConfig)

    def with_emulation(self, **changes: Any) -> "RunConfig":
        """This configuration with emulation fields replaced (a launcher's decision: the mode, the cluster's base
        folder on this machine)."""
        return replace(self, emulation=replace(self.emulation, **changes))

    def launch_dict(self) -> dict[str, Any]:
        """The tree as a launch plan carries it: without `plan` and `out` (each node sets its own)."""
        return {k: v for k, v in self.to_dict().items() if k not in ("plan", "out")}

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON form; the `island` section only for an island run (an ordinary run's file is as before)."""
        doc = {"schema": RUN_SCHEMA, **asdict(self)}
        if not self.island.active:
            del doc["island"]
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.to_json() + "\n", encoding="utf-8")
        return p

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None, *,
                  required: tuple[str, ...] = ("plan", "out")) -> "RunConfig":
        """The tree from its JSON form (or the flat form, without `schema`); `required`: top-level keys that must
        be there (a rank's run.json names its plan and folder; a launch plan's run options do not)."""
        if not isinstance(data, dict):
            raise SpecError(source, "(top level)", "run options must be a JSON object")
        for key in required:
            if key not in data:
                raise SpecError(source, key, "required field is missing", "the launcher writes it")
        nested = _nest(data, source) if "schema" not in data else _check_nested(data, source)
        try:
            sections = {name: SECTIONS[name](**nested.get(name, {})) for name in SECTIONS}
            return cls(plan=str(nested.get("plan", "")), out=str(nested.get("out", "")), **sections)
        except SpecError as err:
            raise SpecError(source, err.field, err.problem, err.fix) from None
        except TypeError as err:
            raise SpecError(source, "(top level)", str(err)) from None

    @classmethod
    def from_flat(cls, **flat: Any) -> "RunConfig":
        """The tree from fields by their flat names (`steps=3, checkpoint_dir="ck"`): the compact form tests and
        scripts write."""
        return cls.from_dict(flat, required=())

    @classmethod
    def load(cls, path: str | Path) -> "RunConfig":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as err:
            raise SpecError(str(path), "(file)", f"cannot read run options: {err.strerror or err}") from None
        except json.JSONDecodeError as err:
            raise SpecError(str(path), f"line {err.lineno}", f"invalid JSON: {err.msg}") from None
        return cls.from_dict(data, str(path))


def _check_nested(data: dict[str, Any], source: str | None) -> dict[str, Any]:
    """The tree's own JSON form: its schema, and no key it does not know (named as `section.key`)."""
    if data["schema"] != RUN_SCHEMA:
        raise SpecError(source, "schema", f"unsupported run options schema {data['schema']!r}",
                        f"expected {RUN_SCHEMA!r}")
    for key, value in data.items():
        if key in ("schema", "plan", "out"):
            continue
        if key not in SECTIONS:
            raise SpecError(source, str(key), "unknown field",
                            f"expected one of: {', '.join(['plan', 'out', 'schema', *SECTIONS])}")
        if not isinstance(value, dict):
            raise SpecError(source, key, "must be a JSON object of its fields")
        known = {f.name for f in fields(SECTIONS[key])}
        for name in value:
            if name not in known:
                raise SpecError(source, f"{key}.{name}", "unknown field",
                                f"expected one of: {', '.join(sorted(known))}")
    return data


def _nest(data: dict[str, Any], source: str | None) -> dict[str, Any]:
    """The flat form (`hetauto.launch/1`, older run folders: every field by its flat name) as the nested one."""
    by_flat = {k.flat: k for k in knobs()}
    nested: dict[str, Any] = {"plan": data.get("plan", ""), "out": data.get("out", "")}
    for key, value in data.items():
        if key in ("plan", "out"):
            continue
        k = by_flat.get(key)
        if k is None:
            raise SpecError(source, str(key), "unknown field",
                            f"expected one of: {', '.join(sorted(['plan', 'out', *by_flat]))}")
        nested.setdefault(k.section, {})[k.name] = value
    return nested
