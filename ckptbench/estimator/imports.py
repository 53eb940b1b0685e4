"""What tracing a step imports (torch, transformers, estimator/trace.py and the training code it runs), imported once
per process as fast as Python can: with the cyclic garbage collector paused, and, in a process ckptbench owns, frozen
after.

Importing torch and transformers makes about 800,000 objects; with the collector running, each collection of the
oldest generation walks the whole growing heap again: 0.5 s of the 2.9 s the import took on a 2-core machine. Once
imported, they live as long as the process; frozen (``gc.freeze``), the collections the traces make walk only what
they make (4% of a short model's trace). Freezing is the process's choice, not a library's: the command line asks
for it (``freeze_imports``, its process ends with the command); a caller's process (the Python API's) keeps its
collector as it was, paused only during the import.
"""

from __future__ import annotations

import gc
import importlib
import sys

_TRACING = "ckptbench.estimator.trace"
_freeze = False


def freeze_imports() -> None:
    """Freeze what ``import_for_tracing`` imports, and every object this process holds then (the command line: its
    process ends with the command)."""
    global _freeze
    _freeze = True


def import_for_tracing() -> None:
    """Import estimator/trace.py (torch, transformers and ckptbench's training code with it) with the cyclic garbage
    collector paused, unless it was imported already; frozen after where ``freeze_imports`` asked."""
    if _TRACING in sys.modules:
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        importlib.import_module(_TRACING)
    finally:
        if enabled:
            gc.enable()
    if _freeze:
        gc.freeze()
