"""How the ``ckptbench`` process ends once its command has: what the interpreter's own exit does first (the threads
that are not daemons joined, the atexit handlers run, the standard streams flushed), then the process is gone,
without the interpreter's teardown.

The teardown clears every module and frees every object one by one; with torch, transformers and the traces loaded
it took 0.24 s of the thread question's cold answer (after the answer was printed, before the prompt came back), and
the objects frozen out of the collector (``gc.freeze``, cli/main.py) did not spare it. Nothing it does is needed by
then: what a command writes is written and closed where it is written (atomic writes, ``with`` blocks: a run's
records, the trace cache); the atexit handlers run (multiprocessing's, ``weakref.finalize``'s, so temporary folders,
logging's, processes/fresh.py's fork server); the streams are flushed. A program or a test that calls
``cli.main.main`` keeps Python's exit: only ``run``, the script's and ``python -m ckptbench``'s entry, ends this way.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

# What CPython exits with when flushing standard output fails at its exit (a reader gone: ``ckptbench ... | head``).
FLUSH_FAILED = 120


def exit_status(code: object) -> int:
    """The status ``SystemExit(code)`` ends a process with, as CPython decides it: None is 0, an integer itself,
    anything else is printed to standard error and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def end_process(code: object) -> NoReturn:
    """End this process with ``SystemExit(code)``'s status once its threads, atexit handlers and streams are done."""
    status = exit_status(code)
    current = threading.current_thread()
    for thread in threading.enumerate():  # as the interpreter's exit does first (daemon threads are not waited for)
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # each handler once, last registered first; one that raises is reported, the rest run
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, a closed stream
            if stream is sys.stdout and status == 0:
                status = FLUSH_FAILED
    os._exit(status & 0xFF)  # what exit() keeps of it
