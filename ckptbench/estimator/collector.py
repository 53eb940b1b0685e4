"""Python's cyclic garbage collector around work that makes many objects: paused while a command reads large runs,
while tracing's libraries are imported, and collecting less often while traces and replays run.

- Reading two runs of 20,000 points builds hundreds of thousands of long-lived objects (records, their dicts and
  lists), and each of them made the collector walk the whole growing heap again and again: a third of ``compare``'s
  time. ``gc_paused`` disables it inside a block (``compare``, ``report``'s plots) and restores it after: nothing made
  meanwhile is reclaimed only by the collector in a way that matters (reference counting frees what is dropped).
- Importing torch and transformers makes about 800,000 objects; with the collector running, each collection of the
  oldest generation walks the whole growing heap again: 0.5 s of the 2.9 s the import took on a 2-core machine.
  ``import_for_tracing`` imports estimator/trace.py (torch, transformers and ckptbench's training code with it) with
  the collector paused, and restores it as it was. Left in the youngest generation, those objects were then walked by
  the first collections after the import (0.36 s of the thread question asked again with 10% headroom, 3.68 -> 3.32
  s); frozen (``gc.freeze``), no collection walks them. Freezing is the process's choice, and it freezes whatever else
  the process holds: the command line asks for it (``freeze_imports``: its process ends with the command), and even
  then it happens only where this import brought torch in, so that nothing built with torch (a sweep's model, whose
  reference cycles must stay collectable between points) can be among what it freezes. A caller's process (the
  Python API's) keeps its collector as it was.
- Traces and replays make millions of short-lived objects (fake tensors, events), which reference counting frees;
  the youngest generation, collected every 700 net allocations, walked them for nothing: 4% of the 704-point
  estimate, 10% of its replays. ``relaxed`` collects it every 20,000 instead while the estimator works (its forked
  workers inherit the setting), and restores the thresholds after: a measured step (whose cyclic garbage may hold
  device memory) never runs under it. Replays make no reference cycles at all (their events are tuples of ints in
  lists; a replay of 48 points left nothing for the collector), and even every 20,000 allocations the collections
  were a tenth of an accumulated step's replay (LLaMA-7B, 4 micro-batches: 11.3 ms a point, 10.2 without): each
  part of ``Estimator.estimate_each`` runs under ``gc_paused``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from collections.abc import Iterator

from ckptbench.estimator.optional_imports import lighter_transformers_import

_TRACING = "ckptbench.estimator.trace"
RELAXED_THRESHOLD = 20_000  # net allocations between collections of the youngest generation (Python's default: 700)
_freeze = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector inside the block (restored after, as it was)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def freeze_imports() -> None:
    """Let ``import_for_tracing`` freeze what it imports, and import transformers without what it does for models
    ckptbench never builds (estimator/optional_imports.py; the command line: its process ends with the command)."""
    global _freeze
    _freeze = True


def import_for_tracing() -> None:
    """Import estimator/trace.py (torch, transformers and ckptbench's training code with it) with the cyclic garbage
    collector paused, unless it was imported already; frozen after where ``freeze_imports`` asked and this import
    brought torch in (see the module docstring). Where it asked (the command line's process), transformers is
    imported without scipy, its models folder scanned once (estimator/optional_imports.py)."""
    if _TRACING in sys.modules:
        return
    torch_is_new = "torch" not in sys.modules
    with gc_paused(), lighter_transformers_import() if _freeze else contextlib.nullcontext():
        importlib.import_module(_TRACING)
        if _freeze and torch_is_new:
            gc.freeze()  # before the collector runs again: no collection walks what was imported


@contextlib.contextmanager
def relaxed() -> Iterator[None]:
    """The youngest generation collected every RELAXED_THRESHOLD net allocations inside the block (never more often
    than it was), the thresholds restored after."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], RELAXED_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
