"""Typed errors. Every error a user can cause is a `HetautoError` whose message is one line that says
what is wrong and how to fix it; the CLI prints it without a traceback."""

from __future__ import annotations

from pathlib import Path


class HetautoError(Exception):
    """Base of every error hetauto raises on purpose. `str(err)` is a complete one-line message."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    @property
    def message(self) -> str:
        return str(self)


class SpecError(HetautoError):
    """An input file (cluster, model, profile, plan) is invalid: names the file, the field path and the fix."""

    def __init__(self, file: str | Path | None, field: str, problem: str, fix: str | None = None) -> None:
        self.file = str(file) if file is not None else None
        self.field = field
        self.problem = problem
        self.fix = fix
        where = f"{self.file}: " if self.file else ""
        at = f"{field}: " if field else ""
        hint = f" ({fix})" if fix else ""
        super().__init__(f"{where}{at}{problem}{hint}")


class BackendUnavailable(HetautoError):
    """A backend was asked for but cannot run here; carries the reason and what to install."""

    def __init__(self, name: str, reason: str, install_hint: str | None = None) -> None:
        self.name = name
        self.reason = reason
        self.install_hint = install_hint
        hint = f"; install with `{install_hint}`" if install_hint else ""
        super().__init__(f"backend '{name}' is unavailable: {reason}{hint}")


class UnknownBackend(HetautoError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(f"unknown backend '{name}'; known backends: {', '.join(sorted(known)) or 'none'}")


class CommunicationError(HetautoError):
    """A collective or point-to-point operation failed or timed out; names the peer when known."""

    exit_code = 3


class PeerFailed(CommunicationError):
    """This rank is fine but a collective verdict says another rank failed (that rank raises the real error);
    the launcher's diagnosis counts it as secondary and blames the rank it names."""


class InfeasiblePlan(HetautoError):
    """No plan (or not this plan) fits the cluster: names the constraint that failed and the numbers."""

    exit_code = 4


class PlanMismatch(HetautoError):
    """A plan does not match the cluster or model it is used with."""


class CheckpointError(HetautoError):
    """A checkpoint is missing, incomplete or unreadable: names the directory and what is wrong."""

    exit_code = 5


class CheckpointMismatch(CheckpointError):
    """A checkpoint does not belong to this job (another model, another optimizer): names the difference."""


class NonFiniteTraining(HetautoError):
    """The loss or the gradients went non-finite (nan/inf) and `--on-nonfinite stop` ended the run before the
    optimizer could write them into the weights: names the step and what was non-finite."""

    exit_code = 6


class NonFiniteCheckpoint(CheckpointError):
    """A checkpoint was not written because the weights or optimizer state hold nan/inf (no checkpoint is ever
    non-finite, so the newest one is always one to resume from)."""
