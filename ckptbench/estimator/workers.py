"""Spread an estimate's independent pieces of work (its traces, then its points) over the cores this process may use.

Each piece is a call ``task(i)`` that returns a picklable result; the workers are forked, so they start with the
parent's state (the imported torch and transformers, the traces already run) and nothing but the index and the
result crosses a pipe. Where forking is not available (not Linux), inside a worker, with one core or one piece, the
calls run in this process, in order. A piece that fails in a worker is run again here, so that its error is raised
as it would have been without workers (the worker's exception may not survive pickling).

``share_pieces`` (the traces) shares queues of pieces between this process and forked ones, each taking from the
queues in its own order, so that each process goes on with pieces alike (a trace's fake-tensor cache is kept from one
to the next) and this one works too; ``map_pieces`` (the points' replays) is it with one queue. ``Background`` runs
one task in a forked process while this one goes on. The results do not depend on the number of workers: every
piece is a pure function of the parent's state.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

R = TypeVar("R")

_in_worker = False
# While processes are being forked, a stop signal waits (the command's handler, cli/common.py CommandSignals, asks
# ``building`` and hands the signal to ``hold``) until every one of them is kept to be stopped: raised in the middle
# of multiprocessing.Pool's constructor (what the workers were before ``share_pieces``), after its workers were forked
# but before it could be terminated, it left a pool whose thread forked new workers as fast as they were stopped,
# and the exit waited on them with no end.
_building = False
_held: list[int] = []
_tracing = 0  # traces running in this process (``held_while_tracing``)


def building() -> bool:
    """Whether a stop signal must wait now: this process is forking its workers (until they are all kept to be
    stopped) or running a trace (``held_while_tracing``)."""
    return _building or _tracing > 0


@contextlib.contextmanager
def held_while_tracing() -> Iterator[None]:
    """A stop signal that comes inside the block is held to its end, and raised there. A trace runs torch's and
    transformers' code, which Python calls back from C++ in the middle of torch's own bookkeeping: raised there, the
    command's ``Stopped`` aborted the process (a dispatch rule's lookup: pybind11's terminate, exit -6), left torch's
    stack of dispatch modes half popped (the unwinding then failed with "trying to pop from empty mode stack"), or
    was dropped inside a fake storage's weak-reference callback (the command went on to its end): 3 of 142 SIGTERMs
    to a cold estimate on a loaded 2-core machine. A trace takes 0.1 to 1 s: the stop waits at most that long."""
    global _tracing
    _tracing += 1
    try:
        yield
    finally:
        _tracing -= 1
        _send_held()


def hold(signum: int) -> None:
    """Keep a stop signal that came while workers were forked: sent again once they are all kept."""
    _held.append(signum)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


WORKERS_ENV = "CKPTBENCH_WORKERS"  # the default number of workers (unset: the available cores)


def default_workers() -> int:
    """``CKPTBENCH_WORKERS`` when it is a positive number, else the available cores."""
    value = os.environ.get(WORKERS_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else available_cores()


def worker_count(requested: int | None, pieces: int) -> int:
    """How many workers ``pieces`` pieces get: ``requested`` (None: ``default_workers()``), at most one per piece."""
    wanted = default_workers() if requested is None else requested
    if wanted < 1:
        raise ValueError(f"workers must be at least 1, not {wanted}")
    return max(1, min(wanted, pieces))


def can_fork() -> bool:
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods() and not _in_worker


@dataclass(frozen=True)
class _Failed:
    error: str


def _send_held() -> None:
    """Send again the stop signal held while workers were forked or a trace ran (the command's handler raises it now),
    once nothing holds it any more."""
    if _held and not building():
        signum = _held[0]
        _held.clear()
        os.kill(os.getpid(), signum)


def _mark_worker(parent: int) -> None:
    global _in_worker, _building
    _in_worker, _building = True, False
    # Ctrl-C reaches the whole process group: the parent alone answers it (it stops the workers); a worker's own
    # KeyboardInterrupt would print a traceback per worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_with(parent)


_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that forked it ends


def end_with(parent: int) -> None:
    """This forked process is killed when ``parent`` (the process that forked it, whose forking thread waits for
    its workers) ends, however it ends. A worker blocked sending a result larger than a pipe's buffer otherwise
    outlived a parent that ended without stopping it (its own copy of the pipe's reading end kept the pipe open): it
    held the command's stderr open, and a caller reading it to its end waited with no end (CI, once)."""
    try:
        import ctypes  # (Linux: the only system workers are forked on)

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the request was made
        os._exit(1)


def map_pieces(task: Callable[[int], R], count: int, *, workers: int | None = None
               ) -> Generator[tuple[int, R], None, None]:
    """``(i, task(i))`` for i in 0..count-1, as each finishes (in order when they run here): ``share_pieces`` with one
    queue, taken in order by this process and ``workers - 1`` forked ones.

    ``workers`` None: as many as the available cores; 1: in this process. (A ``multiprocessing.Pool`` made this
    process wait while two workers worked, and one stopped by a signal right after it was built once waited with no
    end to be terminated, in CI: likely on its task queue's lock, which its ``terminate`` takes and a worker waiting
    for its first task holds.)
    """
    pieces = share_pieces(lambda _, i: task(i), [count], here=(0,), there=(0,), workers=workers)
    with contextlib.closing(pieces):  # its processes stopped as this generator ends, whatever ends it
        for (_, i), result in pieces:
            yield i, result


def share_pieces(
    task: Callable[[int, int], R], sizes: Sequence[int], *, here: Sequence[int], there: Sequence[int],
    first: Callable[[], None] | None = None, workers: int | None = None,
) -> Generator[tuple[tuple[int, int], R], None, None]:
    """Pieces in queues (``sizes[q]`` of them in queue ``q``; piece ``i`` of it is ``task(q, i)``), shared between
    this process and ``workers - 1`` forked ones (None: one per core in all): each takes the next piece of the first
    queue in its order that has one left (``here``: this process's order, ``there``: the forked ones'), so that
    each keeps what it has learnt (a trace's fake-tensor cache) for pieces alike. ``first`` runs here before this
    process takes any; the forked ones start at once, beside it. Yields ``((q, i), task(q, i))`` as each finishes.
    Where no process is forked (``can_fork``, one worker, at most one piece), ``first`` then every piece run here,
    in this process's order. A piece that fails in a forked process runs again here (its error raised as it would
    have been); one whose process ended without it too."""
    total = sum(sizes)
    n = worker_count(workers, total + (first is not None)) if total else 1  # ``first`` keeps this process busy
    if n <= 1 or not can_fork():
        if first is not None:
            first()
        for q in here:
            for i in range(sizes[q]):
                yield (q, i), task(q, i)
        return
    global _building
    context = multiprocessing.get_context("fork")
    taken = context.RawArray("l", len(sizes))  # the next piece of each queue
    lock = context.Lock()

    def take(order: Sequence[int]) -> tuple[int, int] | None:
        with lock:
            for q in order:
                i = taken[q]
                if i < sizes[q]:
                    taken[q] = i + 1
                    return q, int(i)
        return None

    processes: list[Any] = []
    readers: list[Any] = []
    reader: threading.Thread | None = None
    # This process's objects (the traces, torch's and transformers' modules) are frozen out of the garbage collector
    # at the fork: a collection in a forked process would otherwise walk them all and write to every page it shares
    # with this one (copy on write): 1 to 2 of the 704-point grid's 35 CPU-seconds (issue 24).
    gc.freeze()
    try:
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns about forking a process with threads (rich's refresh thread, torch's pools): the
                # forked processes only take pieces, which take no lock another thread may hold.
                warnings.simplefilter("ignore", DeprecationWarning)
                _building = True
                for _ in range(n - 1):
                    receive, send = context.Pipe(duplex=False)
                    process = context.Process(target=_share, args=(task, take, there, send, os.getpid()),
                                              daemon=True)
                    process.start()
                    send.close()
                    processes.append(process)
                    readers.append(receive)
        finally:
            _building = False
            gc.unfreeze()
        _send_held()
        # Their results are read as they come, by a thread: one larger than a pipe's buffer (a trace) would otherwise
        # keep its process waiting while this one works on a piece of its own.
        arrivals: queue.SimpleQueue[Any] = queue.SimpleQueue()
        reader = threading.Thread(target=_read_all, args=(list(readers), arrivals), daemon=True)
        reader.start()
        done: set[tuple[int, int]] = set()
        ended = False

        def arrived(block: bool) -> Iterator[tuple[tuple[int, int], R]]:
            nonlocal ended
            while not ended:
                try:
                    got = arrivals.get(block=block)
                except queue.Empty:
                    return
                if got is None:  # every process has ended
                    ended = True
                    return
                piece, result = got
                done.add(piece)
                yield piece, (task(*piece) if isinstance(result, _Failed) else result)

        if first is not None:
            first()
        while (piece := take(here)) is not None:
            yield from arrived(False)
            done.add(piece)
            yield piece, task(*piece)
        while not ended:
            yield from arrived(True)
        for q in here:  # taken by a process that ended without its result
            for i in range(sizes[q]):
                if (q, i) not in done:
                    yield (q, i), task(q, i)
    finally:
        _building = False
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
        if reader is not None:  # it ends at the pipes' ends, which the processes' end closed
            reader.join()
        for conn in readers:
            conn.close()


def _share(task: Callable[[int, int], Any], take: Callable[[Sequence[int]], tuple[int, int] | None],
           order: Sequence[int], send: Any, parent: int) -> None:
    """A forked process of ``share_pieces``: the pieces it takes, each result (or why it failed) sent back."""
    _mark_worker(parent)
    try:
        while (piece := take(order)) is not None:
            try:
                result: Any = task(*piece)
            except Exception as exc:  # run again in the parent, which raises it in full
                result = _Failed(f"{type(exc).__name__}: {exc}")
            send.send((piece, result))
    finally:
        send.close()


def _read_all(readers: list[Any], arrivals: queue.SimpleQueue[Any]) -> None:
    """Each message of the processes' pipes as it comes, then None once every pipe has ended."""
    try:
        while readers:
            try:
                found = multiprocessing.connection.wait(readers)
            except (OSError, ValueError):  # a pipe closed under it: nothing more comes
                return
            for ready in found:
                conn: Any = ready  # one of the pipes' ends
                try:
                    arrivals.put(conn.recv())
                except Exception:  # its end (or what cannot be read back): its pieces left run here
                    readers.remove(conn)
    finally:
        arrivals.put(None)


class Background(Generic[R]):
    """``task()`` run in a forked process while this one goes on (a context manager: leaving it stops the process if
    its result was not asked for). ``result()`` waits for it; where no process could be forked (``can_fork``, a
    single core, ``CKPTBENCH_WORKERS=1`` or ``workers`` 1) or the task failed there, it runs ``task()`` here, so that
    its error is raised as it would have been. The task must be a pure function of this process's state at the fork:
    its result is then the one it would have returned here. Warnings it raises there are raised again here, once,
    when the result is taken."""

    def __init__(self, task: Callable[[], R], *, workers: int | None = None) -> None:
        self._task = task
        self._process: Any = None
        self._pipe: Any = None
        if (default_workers() if workers is None else workers) < 2 or not can_fork():
            return
        global _building
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        gc.freeze()  # as share_pieces: the child does not copy the pages it shares with this process
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # forking with threads: see share_pieces
                _building = True
                process = context.Process(target=_background, args=(task, send, os.getpid()), daemon=True)
                process.start()
        finally:
            _building = False
            gc.unfreeze()
            send.close()
        self._process, self._pipe = process, receive
        _send_held()

    def result(self) -> R:
        """The task's result (waited for)."""
        if self._process is None:
            return self._task()
        try:
            found = self._pipe.recv()
        except (EOFError, OSError):
            found = _Failed("the process ended without a result")
        finally:
            self._stop()
        if isinstance(found, _Failed):
            return self._task()
        result, caught = found
        for message, category in caught:
            warnings.warn(message, category, stacklevel=2)
        return result

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.is_alive():
                process.terminate()
            process.join()
            self._pipe.close()

    def __enter__(self) -> Background[R]:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop()


def _background(task: Callable[[], Any], send: Any, parent: int) -> None:
    """The forked process of a ``Background``: the task's result and the warnings it raised, or why it failed."""
    _mark_worker(parent)
    try:
        with warnings.catch_warnings(record=True) as caught:  # under the filters this process had at the fork
            result = task()
        send.send((result, [(str(w.message), w.category) for w in caught]))
    except Exception as exc:  # run again in the parent, which raises it in full
        send.send(_Failed(f"{type(exc).__name__}: {exc}"))
    finally:
        send.close()
