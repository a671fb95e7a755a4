"""Where a local run's steps go as they complete, besides `--log-jsonl`: a progress bar on stderr (`StepBar`) and
TensorBoard scalars (`TensorBoardSink`). Each is a `StepSink`: `add(record)` per step, `close()` at the end.

Why apart from the service: the service follows the steps and hands each record to whatever its caller asked
for; how a record is shown is the caller's choice (the API asks for none).
"""

from __future__ import annotations

from typing import Any, Protocol

from hetauto.core.errors import HetautoError

__all__ = ["StepSink", "StepBar", "TensorBoardSink"]


class StepSink(Protocol):
    """Takes each completed step's record (hetauto.runtime.step_log), then is closed once."""

    def add(self, rec: Any) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """TensorBoard scalars per step (the `tensorboard` package's writer, through torch.utils.tensorboard)."""

    def __init__(self, folder: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise HetautoError("--tensorboard needs the tensorboard package: pip install tensorboard") from None
        self.writer = SummaryWriter(log_dir=folder)

    def add(self, rec: Any) -> None:
        w = self.writer
        w.add_scalar("train/loss", rec.loss, rec.step)
        w.add_scalar("train/tokens_per_s", rec.tokens_s, rec.step)
        w.add_scalar("train/step_s", rec.step_s, rec.step)
        for tag, value in (("train/lr", rec.lr), ("train/grad_norm", rec.grad_norm), ("eval/loss", rec.eval_loss),
                           ("train/mfu", getattr(rec, "mfu", None))):
            if value is not None:
                w.add_scalar(tag, value, rec.step)
        w.flush()

    def close(self) -> None:
        self.writer.close()


class StepBar:
    """A progress bar over the run's steps on stderr (rich), with the last loss, tokens/s and the ETA."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
        self.task = self.progress.add_task("steps", total=max(total, 1), info="starting the ranks ...")
        self.progress.start()

    def add(self, rec: Any) -> None:
        held = f" held-out {rec.eval_loss:.4f}" if rec.eval_loss is not None else ""
        mfu = f" MFU {rec.mfu:.1%}" if getattr(rec, "mfu", None) is not None else ""
        island = getattr(rec, "island", None)  # an island run's steps (hetauto.job.island_launch.IslandStep)
        where = f"island {island} " if island else ""
        self.progress.update(self.task, advance=1, info=f"{where}step {rec.step} loss {rec.loss:.4f}{held} "
                                                        f"{rec.tokens_s:,.0f} tokens/s{mfu}")

    def close(self) -> None:
        self.progress.stop()
