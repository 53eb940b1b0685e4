"""Progress bars on stderr: one over a sweep's points, one over an estimate's traces."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ckptbench.cli.common import err
from ckptbench.config.grid import setup_label
from ckptbench.estimator.record import EstimateProgress
from ckptbench.units import fmt_bytes

if TYPE_CHECKING:  # the runner imports torch; the CLI stays fast to start
    from ckptbench.measure.progress import Progress as PointEvent


def _stop(progress: Progress, exc: tuple[Any, ...]) -> None:
    """Stop a bar; when an error or a signal stopped the work, erase it: the one line that says why stays alone
    (issue 35: an error found after the bar started followed an empty 'estimate 0/?' line)."""
    if exc and exc[0] is not None:
        progress.live.transient = True
        progress.live.stop()  # not Progress.stop: off a terminal, it prints an empty line after the bar
        return
    progress.__exit__(*exc)


class SweepProgress:
    """A rich progress bar over points on stderr, with a line per finished point."""

    def __init__(self, total: int) -> None:
        self.progress = Progress(
            TextColumn("[bold]sweep"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=err,
            transient=False,
        )
        self.task = self.progress.add_task("", total=total)

    def __enter__(self) -> SweepProgress:
        self.started = False  # shown from the first point on: an early error stays a single line
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            _stop(self.progress, exc)

    def update(self, event: PointEvent) -> None:
        if not self.started:
            self.progress.__enter__()
            self.started = True
        p = event.point
        label = " ".join(filter(None, [f"{p.layout} b={p.batch_size} s={p.seq_len} {p.precision}",
                                       setup_label(p.key)]))
        rec = event.record
        if rec is None:
            self.progress.update(self.task, description=escape(label), total=event.total)
            return
        if rec.ok:
            detail = (
                f"peak {fmt_bytes(rec.peak_allocated_bytes)}, "
                f"{(rec.median_step_time_s or 0) * 1e3:.1f} ms/step, {rec.tokens_per_s or 0:,.0f} tok/s"
            )
            if rec.warnings:  # busy machine, unsteady steps: the numbers may mislead
                detail += f" ({', '.join(rec.warning_kinds)})"
        else:
            detail = f"{rec.status}: {rec.reason or ''}"
        self.progress.console.print(f"  {label}: {detail}", markup=False)
        self.progress.advance(self.task)


class EstimateProgressBar:
    """A rich progress bar over the traces an estimate runs, on the given (stderr) console."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]estimate"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("", total=None)

    def __enter__(self) -> EstimateProgressBar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        _stop(self.progress, exc)

    def update(self, event: EstimateProgress) -> None:
        label = "" if event.done == event.total else f"tracing {event.label}"
        self.progress.update(self.task, total=event.total, completed=event.done, description=label)
