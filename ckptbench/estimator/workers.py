"""Spread an estimate's independent pieces of work (its traces, then its points) over the cores this process may use.

Each piece is a call ``task(i)`` that returns a picklable result; the workers are forked, so they start with the
parent's state (the imported torch and transformers, the traces already run) and nothing but the index and the
result crosses a pipe. Where forking is not available (not Linux), inside a worker, with one core or one piece, the
calls run in this process, in order. A piece that fails in a worker is run again here, so that its error is raised
as it would have been without workers (the worker's exception may not survive pickling).

The results do not depend on the number of workers: every piece is a pure function of the parent's state.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

R = TypeVar("R")

_task: Callable[[int], Any] | None = None  # the forked workers' task (set before the fork, inherited)
_in_worker = False
# While a pool is being built, a stop signal waits (the command's handler, cli/common.py CommandSignals, asks
# ``building`` and hands the signal to ``hold``): raised in the middle of multiprocessing.Pool's constructor, after
# its workers were forked but before it could be terminated, it left a pool whose thread forked new workers as fast
# as they were stopped, and the exit waited on them with no end.
_building = False
_held: list[int] = []


def building() -> bool:
    """Whether this process is building a pool of workers now (a stop signal is then held until it is built)."""
    return _building


def hold(signum: int) -> None:
    """Keep a stop signal that came while a pool was being built: sent again once it is (``map_pieces``)."""
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
    """Send again the stop signal held while a pool was being built (the command's handler raises it now)."""
    if _held:
        signum = _held[0]
        _held.clear()
        os.kill(os.getpid(), signum)


def _mark_worker() -> None:
    global _in_worker, _building
    _in_worker, _building = True, False
    # Ctrl-C reaches the whole process group: the parent alone answers it (it stops the pool); a worker's own
    # KeyboardInterrupt would print a traceback per worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call(index: int) -> tuple[int, Any]:
    assert _task is not None
    try:
        return index, _task(index)
    except Exception as exc:  # run again in the parent, which raises it in full
        return index, _Failed(f"{type(exc).__name__}: {exc}")


def map_pieces(task: Callable[[int], R], count: int, *, workers: int | None = None) -> Iterator[tuple[int, R]]:
    """``(i, task(i))`` for i in 0..count-1, as each finishes (in order when they run here).

    ``workers`` None: as many as the available cores; 1: in this process.
    """
    n = worker_count(workers, count)
    if n <= 1 or not can_fork():
        for i in range(count):
            yield i, task(i)
        return
    global _task, _building
    previous, _task = _task, task
    # The parent's objects (the traces, torch's and transformers' modules) are frozen out of the garbage collector
    # while the workers run: a collection in a worker would otherwise walk them all and write to every page it
    # shares with the parent (copy on write): 1 to 2 of the 704-point grid's 35 CPU-seconds (issue 24).
    gc.freeze()
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns about forking a process with threads (rich's refresh thread, torch's pools): the
            # workers only run the task, which takes no lock another thread may hold.
            warnings.simplefilter("ignore", DeprecationWarning)
            _building = True
            try:
                pool = multiprocessing.get_context("fork").Pool(n, initializer=_mark_worker)
            except BaseException:
                _building = False
                _send_held()
                raise
        with pool:
            _building = False
            _send_held()  # inside the pool's `with`: the signal held while it was built stops the command now
            for i, result in pool.imap_unordered(_call, range(count)):
                yield i, (task(i) if isinstance(result, _Failed) else result)
    finally:
        _task, _building = previous, False
        gc.unfreeze()


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
        gc.freeze()  # as map_pieces: the child does not copy the pages it shares with this process
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # forking with threads: see map_pieces
                _building = True
                process = context.Process(target=_background, args=(task, send), daemon=True)
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


def _background(task: Callable[[], Any], send: Any) -> None:
    """The forked process of a ``Background``: the task's result and the warnings it raised, or why it failed."""
    _mark_worker()
    try:
        with warnings.catch_warnings(record=True) as caught:  # under the filters this process had at the fork
            result = task()
        send.send((result, [(str(w.message), w.category) for w in caught]))
    except Exception as exc:  # run again in the parent, which raises it in full
        send.send(_Failed(f"{type(exc).__name__}: {exc}"))
    finally:
        send.close()
