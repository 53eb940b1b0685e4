"""What `ckptbench sweep` and `ckptbench tune` share about the run they write: the signals while it runs,
its folders from the options, and what is written and said when it ends or is interrupted."""

from __future__ import annotations

import contextlib
import gc
import shlex
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from ckptbench.cli.common import STOP_SIGNALS, Stopped, err, path_option, send_again_soon, signal_exit_code
from ckptbench.errors import CkptbenchError

if TYPE_CHECKING:  # the sweep imports torch; the CLI stays fast to start
    from ckptbench.results.store import Run
    from ckptbench.sweep.timing import SweepClock


class Interrupts:
    """Ctrl-C, SIGTERM and SIGHUP (a closed terminal: as SIGTERM) raise KeyboardInterrupt once; later ones are
    ignored while the run is marked.

    Two windows need more than that:

    - A signal handled while a finalizer runs (the garbage collector, a weakref callback) raises
      KeyboardInterrupt where Python can only print and drop it ("Exception ignored in ..."), and later
      signals would be ignored. The unraisable hook catches exactly that, re-arms and sends the signal
      again a moment later, so that it lands in ordinary code.
    - Once the run has its final status (``finishing``), a signal changes nothing on disk: it is noted
      (``late``) and the summary is still written, so status, summary and exit code agree. In the real
      command (``ckptbench sweep``, not a test's CliRunner) the signals are then ignored until the
      process has exited: shutting the interpreter down takes a moment too, and Python would restore the
      default handlers for it (a signal there was exit 130 for a complete run). SIGKILL still ends it.
    """

    keep_after_exit = False  # set by cli.main.main: the process ends right after the command

    def __enter__(self) -> Interrupts:
        self.fired = self.finishing = self.late = False
        self.signum: int = signal.SIGINT
        # A signal ignored from the start stays ignored (nohup's SIGHUP: the sweep goes on when the terminal closes).
        taken = [sig for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN]
        self.previous = {sig: signal.signal(sig, self._handle) for sig in taken}
        self.previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.finishing:
            self.late = True
        elif not self.fired:
            self.fired, self.signum = True, signum
            raise Stopped(signum)

    def _unraisable(self, info: sys.UnraisableHookArgs) -> None:
        dropped = info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt)
        if not (dropped and self.fired and not self.finishing):
            self.previous_hook(info)
            return
        self.fired = False
        send_again_soon(self.signum)

    def __exit__(self, *exc: object) -> None:
        sys.unraisablehook = self.previous_hook
        for sig, handler in self.previous.items():
            # SIG_IGN survives interpreter shutdown (Python resets only its own handlers to the default).
            handler = handler if handler is not None else signal.SIG_DFL  # None: set outside Python
            signal.signal(sig, signal.SIG_IGN if self.finishing and self.keep_after_exit else handler)


def hold_late_signals_until_exit() -> None:
    """For the real command line: after a sweep's final status, signals stay notes until the process ends."""
    Interrupts.keep_after_exit = True


def run_paths(out_dir: str | None, results_root: str, resume: str | None) -> tuple[Path | None, Path, Path | None]:
    """--out, --results and --resume as paths (an empty one is refused; --results defaults to results/)."""
    return (
        path_option(out_dir, option="--out"),
        path_option(results_root, option="--results") or Path("results"),
        path_option(resume, option="--resume"),
    )


def finish(run_dir: Path, clock: SweepClock | None) -> None:
    """The command's last act: its whole wall time into run.json, and where it went on stderr."""
    from ckptbench.render.summary import timing_line
    from ckptbench.sweep.timing import record_command_end

    entry = record_command_end(run_dir, clock)
    if entry is not None:
        err.print(timing_line(entry), markup=False, soft_wrap=True)
    # The interpreter's teardown collects every object, more than once: with torch and transformers
    # imported it took 5 s on a busy 2-core machine (load 14), 0.6 s with the objects frozen (they
    # are skipped; modules are still cleared and atexit handlers run), so the process ends soon after
    # the wall time it recorded.
    gc.freeze()


def interrupted(exc: KeyboardInterrupt, config: Path, *, again: str | None = None, signum: int = signal.SIGINT
                ) -> typer.Exit:
    """Say what is on disk after Ctrl-C/SIGTERM/SIGHUP (and write the partial summaries); exit code 130 for
    Ctrl-C, 143 for SIGTERM and SIGHUP (cli/common.py ``signal_exit_code``).

    ``again``: the command that continues the run, up to ``--resume RUN`` (default: ckptbench sweep CONFIG);
    a tune run names tune and its options, whose searches have no total of points known in advance."""
    # A SweepInterrupted once the run directory exists: it says where and how far.
    run_dir, finished, total = (getattr(exc, name, None) for name in ("run_dir", "finished", "total"))
    if run_dir is None:
        err.print("[yellow]interrupted:[/yellow] before the sweep started; no point was run, nothing was written")
        return typer.Exit(signal_exit_code(signum))
    with contextlib.suppress(CkptbenchError, OSError):  # the points themselves are safe already
        summarize_run(run_dir)
    with contextlib.suppress(Exception):  # the command's wall time is a nicety here
        finish(run_dir, getattr(exc, "clock", None))
    again = again or shlex.join(["ckptbench", "sweep", str(config)])
    counted = f"{finished} of {total} points are" if total else f"{finished} point{'s are' if finished != 1 else ' is'}"
    err.print(
        f"[yellow]interrupted:[/yellow] {counted} on disk in {escape(str(run_dir))}; finish with: "
        f"{escape(again)} --resume {escape(shlex.quote(str(run_dir)))}",
        soft_wrap=True,
    )
    return typer.Exit(signal_exit_code(signum))


def summarize_run(run_dir: Path) -> Run:
    """Write summary.csv/summary.md of what is on disk; returns the loaded run."""
    import warnings

    from ckptbench.render.summary import write_summaries
    from ckptbench.results.store import load_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a truncated last line was already reported by the sweep
        run = load_run(run_dir)
    write_summaries(run)
    return run
