"""The command's tracer: a process forked as the ``ckptbench`` command starts, which imports what a trace needs while
the command line imports itself, reads its arguments and works out what to ask, then runs the calls the command's
processes send it (their traces) and sends back what they made.

A trace needs torch, transformers and ckptbench's training code: their import takes 2.1-2.3 s of one core on a 2-core
machine (estimator/collector.py), and the command line's own start (typer, rich, the question's config and plan)
0.35-0.4 s before it; one after the other, as they were, the second core idled through both. Forked first
(cli/__init__.py, before the command line's modules are imported: the tracer runs inside that import and never returns
from it), the tracer imports them beside the command line's start, and the command's process never imports torch to
trace: its replays fork from a small process. The thread's question cold: 5.0 -> 4.9 s (it imports what the command
line imports too, which the import in the command's process found loaded: the gain is that start less those).

What crosses: a call (a module-level function and its arguments, pickled by name), the progress it reports, then its
result and the warnings it raised, over a Unix socket in the abstract namespace, each connection authenticated by a key
only the command's processes hold (multiprocessing.connection: no other process can send it a call). A call that asks
for it (``here``: the command's first traces) runs in the tracer itself, so that what a first trace pays once
(fake-tensor caches, transformers' lazy imports, the short models prepared) is paid there once; a process's later
calls run in one process the tracer forks for its connection (a session: what each call made is kept for the next),
a call beside (``submit``) in one of its own, so that several run side by side (an advice's accumulation traces beside
its largest-batch probes), each from that state.

Never more than a move of work: where no tracer runs (``CKPTBENCH_TRACER=0``, one worker asked for, no fork, a program
or a test that imports ckptbench), where it ended, or where a call failed there, the call runs in the asking process as
before (each call is a pure function of its arguments: the same result either way). A command whose first traces were
all on disk releases it unused (``release_unused``), and a command on a subject answered with this cache before starts
none (``start``, ``answered``): the traces it may still need run in its own process.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any, TypeVar

from ckptbench.estimator.collector import freeze_imports, import_for_tracing
from ckptbench.estimator.workers import can_fork, default_workers, end_with

T = TypeVar("T")

TRACER_ENV = "CKPTBENCH_TRACER"  # "0": no tracer (every trace runs in the process that needs it)
TRACING_COMMANDS = frozenset({"advise", "estimate"})  # the commands that trace (where their traces are not on disk)
_CAUGHT_LIMIT = 20  # warnings sent back with a result, at most


class TracerGone(Exception):
    """The tracer did not answer a call (it ended, or the call failed there): the caller runs it itself."""


def wanted(argv: Sequence[str]) -> bool:
    """Whether the command line ``argv`` (without the program's name) runs a command that traces, with more than one
    worker, where a process can be forked and the tracer is not turned off."""
    if os.environ.get(TRACER_ENV, "").strip() == "0" or default_workers() < 2 or not can_fork():
        return False
    command = next((word for word in argv if not word.startswith("-")), None)
    if command not in TRACING_COMMANDS or any(word in ("--help", "-h") for word in argv):
        return False
    for i, word in enumerate(argv):  # one worker asked for: one process works at a time (``--workers``)
        value = word.partition("=")[2] if word.startswith("--workers=") else (
            argv[i + 1] if word == "--workers" and i + 1 < len(argv) else None)
        if value is not None and value.strip() == "1":
            return False
    return True


class Tracer:
    """The command's side of the tracer: its address and key (a process forked from the command's holds them too, and
    calls it on a connection of its own)."""

    def __init__(self, address: str, authkey: bytes, pid: int, owner: int) -> None:
        self.address, self.authkey, self.pid, self.owner = address, authkey, pid, owner
        self.gone = False
        self.used = False  # a call ran there (``release_unused`` leaves it)
        self._session: tuple[int, Connection] | None = None  # this process's connection for its calls one by one

    @classmethod
    def fork(cls) -> Tracer | None:
        """Fork the tracer: it imports tracing's libraries, then serves calls until this process ends (None where no
        process could be forked)."""
        authkey = os.urandom(32)
        address = f"\0ckptbench-tracer-{os.getpid()}-{os.urandom(8).hex()}"
        owner = os.getpid()
        # Listening before the fork: a call made before the tracer is ready waits in the socket's backlog.
        listener = Listener(address, family="AF_UNIX", backlog=16, authkey=authkey)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = _fork()
        if pid == 0:  # the tracer: it never returns
            status = 0
            try:
                _serve(listener, owner)
            except BaseException:  # (whatever ends it: the command runs its calls itself)
                status = 1
            finally:
                os._exit(status)
        listener.close()  # (this process's copy: an abstract address has no file to remove)
        return None if pid < 0 else cls(address, authkey, pid, owner)

    def call(self, fn: Callable[..., Any], *args: Any, here: bool = False,
             on_progress: Callable[[Any], None] | None = None) -> Any:
        """``fn(*args)`` run by the tracer (in itself where ``here``, else in a process forked for the call), its
        result returned and its warnings raised again here; with ``on_progress``, ``fn(*args, progress=...)``, each
        report handed to ``on_progress`` as it comes. ``TracerGone`` where it did not answer."""
        if here:
            return self.submit(fn, *args, here=True, progress=on_progress is not None).result(on_progress)
        return Pending(self, self._connected(), keep=True).sent(fn, args, on_progress is not None).result(on_progress)

    def _connected(self) -> Connection:
        """This process's session: one connection for its calls one after the other, served by one process the tracer
        forks for it (which keeps what each call made for the next: the short models prepared, the fake-tensor
        caches). A process forked from this one opens its own."""
        if self._session is not None and self._session[0] == os.getpid():
            return self._session[1]
        conn = self._connect()
        self._session = (os.getpid(), conn)
        return conn

    def _connect(self) -> Connection:
        if self.gone:
            raise TracerGone("the tracer has ended")
        try:
            return Client(self.address, family="AF_UNIX", authkey=self.authkey)
        except (OSError, EOFError, ValueError) as exc:
            self.gone = True
            raise TracerGone(f"the tracer did not take the call: {exc}") from None

    def submit(self, fn: Callable[..., Any], *args: Any, here: bool = False, progress: bool = False) -> Pending:
        """``call``, without waiting: the call runs there while this process goes on; ``Pending.result`` takes it."""
        return Pending(self, self._connect(), here=here).sent(fn, args, progress)

    def stop(self) -> None:
        """End the tracer (and the processes it forked: they end with it)."""
        self.gone = True
        if os.getpid() == self.owner:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)


class Pending:
    """A call the tracer is running (``Tracer.submit``)."""

    def __init__(self, tracer: Tracer, conn: Connection, *, here: bool = False, keep: bool = False) -> None:
        self._tracer, self._conn, self._here, self._keep = tracer, conn, here, keep

    def sent(self, fn: Callable[..., Any], args: tuple[Any, ...], progress: bool) -> Pending:
        """The call sent (``TracerGone`` where it could not be)."""
        try:
            self._conn.send((fn, args, self._here, progress))
        except (OSError, EOFError, ValueError) as exc:
            self._tracer.gone = True
            self._conn.close()
            raise TracerGone(f"the tracer did not take the call: {exc}") from None
        self._tracer.used = True
        return self

    def result(self, on_progress: Callable[[Any], None] | None = None) -> Any:
        """The call's result (waited for), its progress reports handed to ``on_progress`` as they come."""
        try:
            while True:
                try:
                    kind, value = self._conn.recv()
                except (OSError, EOFError) as exc:
                    self._tracer.gone = True
                    raise TracerGone(f"the tracer ended during the call: {exc}") from None
                if kind == "progress":
                    if on_progress is not None:
                        on_progress(value)
                    continue
                if kind == "failed":
                    self._tracer.gone = True  # (the caller runs it itself, raising as it would have)
                    raise TracerGone(f"the call failed in the tracer: {value}")
                result, caught = value
                for message, category in caught:
                    warnings.warn(message, category, stacklevel=2)
                return result
        except TracerGone:
            self._conn.close()
            raise
        finally:
            if not self._keep:
                self._conn.close()

    def close(self) -> None:
        """Leave the call (its connection closed: the process serving it ends)."""
        self._conn.close()


_tracer: Tracer | None = None
_first_asked = False
_marker: Path | None = None  # where this command notes that it answered its subject (``answered``)


def start(argv: Sequence[str]) -> None:
    """Fork the command's tracer where the command line ``argv`` (without the program's name) may trace, unless a
    command on the same subject (advise's model, estimate's config) answered with this cache before: its traces are
    likely on disk, and a tracer would only take a core from the answer (asked again, 0.34 -> 0.39 s for the 66-point
    estimate). Where the guess is wrong, its traces run in the command's process, as without a tracer."""
    global _tracer, _marker
    if _tracer is not None or torch_here() or not wanted(argv):
        return
    _marker = _subject_marker(argv)
    if _marker is None or not _marker.exists():
        _tracer = Tracer.fork()


def answered() -> None:
    """Note that this command answered its subject (its traces are kept on disk): the next command on it starts no
    tracer (``start``)."""
    if _marker is not None:
        with contextlib.suppress(OSError):
            _marker.parent.mkdir(parents=True, exist_ok=True)
            _marker.touch()


def _subject_marker(argv: Sequence[str]) -> Path | None:
    """The file that says a command on ``argv``'s subject answered with this trace cache (None: the cache is off).
    The subject: advise's ``--model``; estimate's words but its options (the config, resolved)."""
    from ckptbench.estimator.trace_cache import default_cache

    cache = default_cache()
    if cache is None:
        return None
    command = next(word for word in argv if not word.startswith("-"))
    if command == "advise":
        given = [v for w, v in itertools.pairwise(argv) if w == "--model"]
        subject = [*given, *(w.partition("=")[2] for w in argv if w.startswith("--model="))][-1:]
    else:
        subject = [os.path.abspath(w) if os.path.exists(w) else w for w in argv if not w.startswith("-")]
    return cache.marker("\0".join([command, *subject]))


def serving() -> Tracer | None:
    """The command's tracer, where one runs, has not ended or been released, and this process has not imported torch
    itself (where it has, a trace here costs no import)."""
    tracer = _tracer
    if tracer is None or tracer.gone or torch_here():
        return None
    return tracer


def torch_here() -> bool:
    """Whether this process has imported torch."""
    return "torch" in sys.modules


def first_call() -> bool:
    """True once, in the command's own process: its first traces run in the tracer itself (``here``), later ones in
    processes forked from it."""
    global _first_asked
    tracer = _tracer
    if tracer is None or _first_asked or os.getpid() != tracer.owner:
        return False
    _first_asked = True
    return True


def where_imported(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a call that needs torch or transformers, run by the command's tracer where one serves (it has
    imported them, or is importing them), in the tracer itself; else here."""
    tracer = serving()
    if tracer is not None:
        try:
            result: T = tracer.call(fn, *args, here=True)
            return result
        except TracerGone:
            pass
    return fn(*args)


def release_unused() -> None:
    """End the tracer where no call ran there: the command's first traces were on disk, and its import would only
    compete with the command's replays for the cores."""
    tracer = _tracer
    if tracer is not None and not tracer.used and not tracer.gone and os.getpid() == tracer.owner:
        tracer.stop()


def _serve(listener: Listener, owner: int) -> None:
    """The tracer: listen, import, then run each call (here, or in a process forked for it) until the command ends."""
    global _tracer
    _tracer = None  # (this process is the tracer: its own traces run here)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the command answers it
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    end_with(owner)
    with warnings.catch_warnings(record=True) as caught:  # sent back with the first call's result
        freeze_imports()  # (this process ends with the command, as the command line's does)
        import_for_tracing()
    pending_warnings = [(str(w.message), w.category) for w in caught]
    handlers: list[int] = []
    while True:
        try:
            conn = listener.accept()  # (a connection without the key fails here, before anything is read from it)
            fn, args, here, with_progress = conn.recv()
        except Exception:  # a connection that failed: the next one
            continue
        handlers = [pid for pid in handlers if not _ended(pid)]
        if here:
            _answer(conn, fn, args, with_progress, pending_warnings)
            pending_warnings = []
            conn.close()
            continue
        gc.freeze()  # the forked process does not copy the pages it shares with this one (estimator/workers.py)
        try:
            pid = _fork()
        finally:
            gc.unfreeze()
        if pid == 0:
            status = 0
            try:
                listener.close()
                end_with(os.getppid())
                _answer(conn, fn, args, with_progress, pending_warnings)
                while True:  # the connection's next calls, one by one, until the caller closes it
                    try:
                        fn, args, _, with_progress = conn.recv()
                    except (OSError, EOFError):
                        break
                    _answer(conn, fn, args, with_progress, [])
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        if pid < 0:  # no process forked: answered here
            _answer(conn, fn, args, with_progress, pending_warnings)
        else:
            handlers.append(pid)
        pending_warnings = []
        conn.close()


def _fork() -> int:
    """``os.fork()``, -1 where it failed. (Python 3.12+ warns about forking a process with threads, as torch's may have:
    the forked process runs only the call, which takes no lock another thread may hold, as estimator/workers.py's.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return os.fork()
        except OSError:
            return -1


def _ended(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _answer(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...], with_progress: bool,
            earlier: list[tuple[str, type[Warning]]]) -> None:
    """Run one call, sending its progress as it comes, then its result and the warnings it raised (or why it failed)."""

    def progress(report: Any) -> None:
        conn.send(("progress", report))

    try:
        with warnings.catch_warnings(record=True) as caught:  # under the filters this process has
            result = fn(*args, progress=progress) if with_progress else fn(*args)
        found = [*earlier, *((str(w.message), w.category) for w in caught)][:_CAUGHT_LIMIT]
        conn.send(("done", (result, found)))
    except Exception as exc:
        with contextlib.suppress(OSError, ValueError):  # (the caller gone)
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
