"""Cyclic garbage collection paused while a command reads a large run into memory.

Reading two runs of 20,000 points builds hundreds of thousands of long-lived objects (records, their
dicts and lists), and each of them makes Python's cyclic collector walk the whole growing heap again
and again: a third of ``compare``'s time. Nothing a command builds in the meantime is reclaimed only
by the cyclic collector in a way that matters (reference counting frees what it drops), and the process
ends with the command; the collector runs again when the block ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector inside the block (restored after, as it was)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
