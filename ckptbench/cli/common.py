"""What every command shares: the two consoles, the one error handler, the output Format, common options."""

from __future__ import annotations

import codecs
import contextlib
import io
import math
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from ckptbench.errors import EXIT_BAD_INPUT, CkptbenchError, ConfigError

NO_TERMINAL_WIDTH = 200  # stdout with no terminal anywhere (CI logs, files) and no COLUMNS


def _any_terminal() -> bool:
    for fd in (0, 1, 2):
        try:
            if os.get_terminal_size(fd).columns > 0:
                return True
        except (OSError, ValueError):
            continue
    return False


class _Stdout(Console):
    """stdout: as wide as ``COLUMNS`` says, else as the terminal (also when piped into ``less`` or
    ``head`` from one), else NO_TERMINAL_WIDTH. Read at every print, so tests can set COLUMNS."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        columns = os.environ.get("COLUMNS", "")
        if self._width is None and not (columns.isdigit() and int(columns) > 0) and not _any_terminal():
            return ConsoleDimensions(NO_TERMINAL_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


class _Environ(Mapping[str, str]):
    """os.environ as the consoles read it, live, except that COLUMNS or LINES that is not a positive number is
    unset: rich took COLUMNS=0 as a width of 0 and printed nothing at all, errors included."""

    _SIZES = ("COLUMNS", "LINES")

    def __getitem__(self, name: str) -> str:
        value = os.environ[name]
        if name in self._SIZES and not (value.strip().isdigit() and int(value) > 0):
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return (name for name in os.environ if name in self or name not in self._SIZES)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True


def _live(console: Console) -> Console:
    """rich reads COLUMNS and LINES once, when a console is made (at import): forget what it read, so that each
    print reads them again (COLUMNS set after the import: pytest-xdist starts its workers with COLUMNS=80)."""
    console._width = console._height = None
    return console


# Tables go to stdout (fitted to its width: render/tables.py); progress, warnings and errors to stderr.
out = _live(_Stdout(highlight=False, soft_wrap=False, _environ=_Environ()))
err = _live(Console(stderr=True, highlight=False, _environ=_Environ()))


# click's base classes, reached through typer's public BadParameter: typer >= 0.2x vendors its own click.
_MRO = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
UsageError: type[Exception] = _MRO["UsageError"]
ClickException: type[Exception] = _MRO["ClickException"]


def fail(exc: CkptbenchError | Exception) -> typer.Exit:
    """Print one red line to stderr and turn the error into its exit code.

    A CkptbenchError keeps its own code; click's errors (a bad option value, an unknown option, a
    missing argument) become the same one line, exit code 2, instead of a usage box.
    """
    text = usage_line(exc) if isinstance(exc, ClickException) else str(exc)
    code = getattr(exc, "exit_code", EXIT_BAD_INPUT)
    # The message may quote user input: escape markup, no emoji codes, never wrap it.
    err.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True, markup=True, emoji=False)
    return typer.Exit(code if isinstance(code, int) else EXIT_BAD_INPUT)


def usage_line(exc: Exception) -> str:
    """One line from click's error: 'compare: Invalid value for '--format': ... (see ckptbench compare --help)'."""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    message = " ".join(message.replace("Value error, ", "").split())
    ctx: Any = getattr(exc, "ctx", None)
    command = ctx.info_name if ctx is not None and ctx.parent is not None else ""  # '' for the group itself
    hint = f" (see ckptbench {command} --help)" if command else " (see ckptbench --help)"
    return f"{command}: {message}{hint}" if command else f"{message}{hint}"


def finite(value: float | None) -> float | None:
    """A typer callback: refuse nan and inf in a number option (click's ranges let them through)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


def path_option(value: str | None, *, option: str) -> Path | None:
    """A path given on the command line; '' is refused (Path('') would silently mean the current folder)."""
    if value is None:
        return None
    if not value.strip():
        raise ConfigError(f"{option}: an empty path; give a folder, e.g. {option} results/my-run")
    return Path(value)


def warn(text: str) -> None:
    """One yellow warning line on stderr."""
    err.print(f"[yellow]warning:[/yellow] {escape(text)}", soft_wrap=True)


BIG_INPUT_BYTES = 2**20  # a config this large (thousands of explicit points) takes seconds to read and expand


@contextlib.contextmanager
def reading(path: Path, *, what: str = "the config") -> Iterator[None]:
    """While a command reads ``path`` before its own progress starts: a spinner on a terminal, and for a large
    input one line on stderr first, so that a minute of parsing and expanding is never silent."""
    with contextlib.suppress(OSError):
        if path.is_file() and path.stat().st_size > BIG_INPUT_BYTES:
            err.print(f"reading {what} {escape(str(path))} ({path.stat().st_size / 2**20:.1f} MiB) and expanding "
                      "its points ...", soft_wrap=True)
    with err.status(f"reading {escape(str(path))} ..."):
        yield


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """Python's warnings (a skipped record of a damaged run, a library's note) as one ``warning:`` line on
    stderr, instead of 'store.py:215: UserWarning:' and the source line."""
    warn(" ".join(str(message).split()))


def _no_flag_types(params: list[Any]) -> list[Any]:
    # typer's rich help prints '<bool>' as the type of every flag (--help included), but a flag takes
    # no value. An empty metavar is shown instead (duck-typed: typer 0.2x vendors its own click).
    for param in params:
        if getattr(param, "is_flag", False) and getattr(param, "metavar", "") is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    """A command whose --help shows no value type for flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_types(super().get_params(ctx))


# The signals that stop a command, and its exit code for each: 128 + the signal's number, and SIGHUP (a closed
# terminal or ssh session) as SIGTERM, 143, not 129 (issue 35).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def taken_signals() -> tuple[int, ...]:
    """The stop signals a command acts on: those its parent did not set to be ignored. A signal ignored from the start
    stays ignored, as it would in any program (``nohup ckptbench sweep ...`` goes on when the terminal closes)."""
    return tuple(sig for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN)


def signal_exit_code(signum: int) -> int:
    """130 for Ctrl-C (SIGINT), 143 for SIGTERM and SIGHUP."""
    return 130 if signum == signal.SIGINT else 143


def signal_text(signum: int) -> str:
    """'Ctrl-C (SIGINT)', 'SIGTERM', 'SIGHUP'."""
    name = signal.Signals(signum).name
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else name


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) in a command: raised where the command is, as Ctrl-C always was,
    so that ``finally`` blocks and context managers (a pool of workers, a temporary file) clean up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_text(signum))
        self.signum = signum


class CommandSignals:
    """SIGINT, SIGTERM and SIGHUP raise ``Stopped`` in the command (once; later ones are ignored while it stops).

    Without this, SIGTERM and SIGHUP ended a command at once, silently, with no cleanup (an estimate's workers ran
    on for seconds, printing BrokenPipeError tracebacks). A process forked from this one (an estimate's workers)
    inherits the handler: there it does what the signal would have done, ending that process quietly."""

    def __init__(self) -> None:
        self.signum: int = signal.SIGINT
        self.stopping = False
        self.pid = os.getpid()
        self.previous: dict[int, Any] = {}
        self.previous_hook: Any = None

    _fork_hook = False  # _default_in_forked_child registered (once per process: it cannot be taken back)

    def __enter__(self) -> CommandSignals:
        if not CommandSignals._fork_hook and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_default_in_forked_child)
            CommandSignals._fork_hook = True
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            self.previous = {sig: signal.signal(sig, self._handle) for sig in taken_signals()}
            self.previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        # A signal that came while the command's modules were imported (cli/__init__.py held it) stops it now.
        held = [sig for handler in self.previous.values() for sig in getattr(handler, "held", ())]
        if held:
            self.__exit__()
            raise Stopped(held[0])
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        if os.getpid() != self.pid:  # a forked worker: the signal's own action
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        from ckptbench.estimator import workers  # (imported by then where workers are forked: no torch)

        if workers.building():  # workers half forked, or a trace running: it comes again once that is over
            workers.hold(signum)
            return
        if not self.stopping:
            self.stopping, self.signum = True, signum
            raise Stopped(signum)

    def _unraisable(self, info: sys.UnraisableHookArgs) -> None:
        """A ``Stopped`` raised where Python cannot raise it (the signal came while a weak reference's callback or a
        ``__del__`` ran: a fake tensor's storage freed in a trace, estimator/live_storage.py) is dropped there, with
        an "Exception ignored" traceback, and the command went on to its end as if no signal had come (CI, once; 1 in
        40 SIGTERMs to a cold estimate on a loaded 2-core machine): it is sent again, to land in ordinary code."""
        if isinstance(info.exc_value, Stopped) and self.stopping and os.getpid() == self.pid:
            self.stopping = False
            send_again_soon(self.signum)
            return
        (self.previous_hook or sys.__unraisablehook__)(info)

    def __exit__(self, *exc: object) -> None:
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self.previous_hook or sys.__unraisablehook__
        for sig, handler in self.previous.items():
            # A sweep whose final status is written ignores signals until the process ends (cli/runs.py
            # Interrupts.keep_after_exit): that stays.
            if signal.getsignal(sig) == self._handle:
                # The early hold (cli/__init__.py) has done its work: the handler from before it comes back.
                handler = getattr(handler, "original", {}).get(sig, handler)
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # None: set outside Python


def send_again_soon(signum: int) -> None:
    """Send ``signum`` to this process again a moment later, from another thread (a stop signal raised where Python
    can only drop it, inside a finalizer: not from there, where it would land in the same finalizer again)."""
    again = threading.Timer(0.05, os.kill, (os.getpid(), signum))
    again.daemon = True
    again.start()


def _default_in_forked_child() -> None:
    """In a process forked while a command runs (an estimate's workers), the stop signals take their own action, in
    the kernel. A Python handler runs only between two bytecodes: a worker busy in a long C call, or stuck in one,
    never ran it, and the pool's terminate() waited on that worker with no end (a SIGTERM that did not stop the
    estimate; a worker the pool started in place of one already stopped outlived the command, and the exit waited
    on it). Only the command's own handlers (and the early hold's) are replaced; a sweep's (cli/runs.py) stay."""
    for sig in STOP_SIGNALS:
        handler = signal.getsignal(sig)
        if isinstance(getattr(handler, "__self__", None), CommandSignals) or hasattr(handler, "held"):
            with contextlib.suppress(ValueError):  # forked from a thread other than the main one: nothing to do
                signal.signal(sig, signal.SIG_DFL)


def stop_children() -> None:
    """End the worker processes this process started (an estimate's pool), without waiting for their work."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:
        return
    children = multiprocessing.active_children()
    for child in children:
        with contextlib.suppress(Exception):
            child.terminate()
    for child in children:
        with contextlib.suppress(Exception):
            child.join(timeout=2)


def _stopped_under(exc: BaseException) -> KeyboardInterrupt | None:
    """The stop signal (``Stopped``, or Ctrl-C's KeyboardInterrupt) an error was raised while handling, if any: a
    signal is raised between any two bytecodes, also in the middle of a library's own bookkeeping (torch's stack of
    dispatch modes, left half popped: its ``with`` block's exit then raised "trying to pop from empty mode stack"),
    and an error raised while it unwound the command is the signal's doing, not a failure of its own."""
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, KeyboardInterrupt):
            return found
        if found.__suppress_context__:  # raised on purpose in place of what it was handling ("from None")
            return None
        seen.add(id(found))
        found = found.__context__
    return None


def stopped_exit(command: str | None, signum: int) -> typer.Exit:
    """After a stop signal in a command that does not say more itself: one line on stderr, exit 130 or 143. What
    a command writes is written whole or not at all (results/store.py atomic_file), so nothing is left cut."""
    stop_children()
    name = f"ckptbench {command}" if command else "ckptbench"
    err.print(f"[yellow]interrupted:[/yellow] {escape(name)} stopped by {signal_text(signum)}; no file was left "
              "half-written", soft_wrap=True)
    return typer.Exit(signal_exit_code(signum))


class Group(TyperGroup):
    """The application: --help and --version show no value type either, and click's errors go through
    the one error handler (``fail``): one line and exit code 2 for a bad option value, an unknown option
    or a missing argument, instead of a usage box. A stop signal is one line and exit code 130 or 143."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_types(super().get_params(ctx))

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:  # before click, which would print an empty line and abort
            signum = getattr(exc, "signum", signal.SIGINT)
            raise stopped_exit(ctx.invoked_subcommand, signum) from None
        except Exception as exc:
            stop = None if isinstance(exc, (typer.Exit, ClickException)) else _stopped_under(exc)
            if stop is None:  # (a command's own exit, also one it chose for a signal: cli/runs.py interrupted)
                raise
            raise stopped_exit(ctx.invoked_subcommand, getattr(stop, "signum", signal.SIGINT)) from None

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("standalone_mode", True) is False:
            return super().main(*args, **kwargs)
        _tolerant_streams()
        try:
            with warnings.catch_warnings(), CommandSignals():  # both restored when the command returns
                warnings.showwarning = _show_warning
                # Not standalone: click hands us its errors and exit codes instead of printing and exiting.
                code = super().main(*args, **{**kwargs, "standalone_mode": False})
        except ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no command given: the help was the answer
                sys.exit(getattr(exc, "exit_code", EXIT_BAD_INPUT))
            code = fail(exc).exit_code
        except typer.Abort:  # a signal while click parsed the command line
            code = stopped_exit(None, signal.SIGINT).exit_code
        except Stopped as exc:  # a signal held since the command's modules were imported (CommandSignals)
            words = list(args[0] if args and args[0] is not None else sys.argv[1:])
            code = stopped_exit(words[0] if words and words[0] in self.commands else None, exc.signum).exit_code
        sys.exit(code if isinstance(code, int) else 0)


# What a terminal that is not UTF-8 (PYTHONIOENCODING=ascii, LANG=C with PYTHONUTF8=0) gets for the few characters
# ckptbench prints beyond ASCII; any other becomes '?'. Tables switch to ASCII borders by themselves (rich).
_ASCII = {"±": "+/-", "×": "x", "…": "...", "—": "-", "–": "-", "≈": "~", "≤": "<=", "≥": ">=", "→": "->",
          "µ": "u", "·": "-", "’": "'", "‘": "'", "“": '"', "”": '"', "✓": "v", "✗": "x", "↑": "^", "↓": "v",
          "\u2009": " ", "\u00a0": " "}
_ERRORS = "ckptbench-ascii"


def _ascii_fallback(exc: UnicodeError) -> tuple[str | bytes, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    text = exc.object[exc.start:exc.end]
    if all("\udc80" <= c <= "\udcff" for c in text):  # a file name's undecodable bytes: written as they were
        return codecs.lookup_error("surrogateescape")(exc)
    return "".join(_ASCII.get(c, "?") for c in text), exc.end


codecs.register_error(_ERRORS, _ascii_fallback)


def _tolerant_streams() -> None:
    """stdout and stderr never raise UnicodeEncodeError (issue 35: `sweep` under PYTHONIOENCODING=ascii exited 1
    with a traceback after its run had completed): a character the encoding lacks is written as ASCII."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors in ("strict", "surrogateescape"):
            with contextlib.suppress(Exception):
                stream.reconfigure(errors=_ERRORS)


def example(*lines: str) -> dict[str, Any]:
    """Keyword arguments for ``app.command``: the command class and an example shown under --help."""
    text = "\n\n".join(f"  {line}" for line in lines)
    return {"cls": Command, "epilog": f"Example:\n\n{text}"}


class Format(str, Enum):
    """Output formats: a table for people; Markdown, CSV and JSON (complete, unstyled) for files and pipes."""

    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


ConfigArg = Annotated[
    Path, typer.Argument(metavar="CONFIG", help="Sweep config (YAML), e.g. configs/llama7b.yaml.", show_default=False)
]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="A run directory, or a run name under --results.")]
FormatOpt = Annotated[Format, typer.Option("--format", help="table (default), markdown, csv or json.")]
ResultsOpt = Annotated[Path, typer.Option("--results", metavar="DIR", help="Where run names are looked up.")]
# A new run's folders, as text: typer turns '' into '.', and '' must be refused (path_option).
OutDirOpt = Annotated[
    str | None,
    typer.Option("--out", metavar="RUN_DIR", help="Run directory (default results/<name>-<timestamp>)."),
]
ResultsRootOpt = Annotated[str, typer.Option("--results", metavar="DIR", help="Folder for new run directories.")]
BudgetOpt = Annotated[
    str | None,
    typer.Option("--budget", metavar="SIZE",
                 help="Memory budget: GiB (80) or with a binary unit (80GiB, 512MiB); GB is refused as ambiguous."),
]
HeadroomOpt = Annotated[
    str, typer.Option("--headroom", metavar="PCT|SIZE",
                      help="Kept free under the budget: a share of it (5%) or a size (2GiB).")
]
SeqLenOpt = Annotated[
    int | None, typer.Option("--seq-len", metavar="N", help="Only consider points of this sequence length.")
]
