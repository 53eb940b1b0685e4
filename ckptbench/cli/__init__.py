"""The command line (typer): parse, call one core function, render; the only package that imports typer.

Owns the consoles, the one error handler (CkptbenchError -> exit code), the Format enum and the
progress bars. Must not compute anything: every number comes from the core packages.
"""


def _hold_signals_until_the_command_starts() -> None:
    """In the ``ckptbench`` process itself (the console script or ``python -m ckptbench``), never in a program or
    a test that imports the package: a stop signal that arrives while the command's modules are imported (a few
    tenths of a second) is held, and the command stops on it with its one line as soon as it starts (cli/common.py
    CommandSignals). Before, a Ctrl-C then printed a KeyboardInterrupt traceback and SIGTERM or SIGHUP ended the
    process silently (issue 35). A signal the parent set to be ignored (nohup's SIGHUP) stays ignored."""
    import signal
    import threading

    if not _command_process() or threading.current_thread() is not threading.main_thread():
        return
    held = HeldSignals()
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            held.original[sig] = signal.signal(sig, held)


def _command_process() -> bool:
    """Whether this is the ``ckptbench`` process itself (the console script or ``python -m ckptbench``)."""
    import os
    import sys

    main = sys.modules.get("__main__")
    by_module = getattr(getattr(main, "__spec__", None), "name", None) == "ckptbench.__main__"
    by_script = os.path.basename(sys.argv[0] if sys.argv else "").removesuffix(".exe") == "ckptbench"
    return by_module or by_script


def _start_the_tracer() -> None:
    """In the ``ckptbench`` process itself, for a command that traces: its tracer, forked before the command line's
    modules are imported, imports torch and transformers beside them (estimator/tracer.py)."""
    import sys

    if _command_process():
        from ckptbench.estimator import tracer

        tracer.start(sys.argv[1:])


class HeldSignals:
    """The handler of the stop signals until a command's own are set: it notes each one (``held``)."""

    def __init__(self) -> None:
        self.held: list[int] = []
        self.original: dict[int, object] = {}  # each signal's handler before: the command restores it when done

    def __call__(self, signum: int, _frame: object) -> None:
        self.held.append(signum)


_hold_signals_until_the_command_starts()
_start_the_tracer()
