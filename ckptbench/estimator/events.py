"""The ordered allocations and frees of a traced step: what the caching allocator would be asked, and when.

The byte model (estimator/tracker.py) keeps running totals; the allocator replay
(estimator/allocator.py) needs the requests themselves, in execution order. ``EventLog`` records
each one as ``(op, id, nbytes, segment)``: ``op`` is ALLOC or FREE, ``id`` names the allocation
(a tensor storage, or a kernel's scratch buffer), ``nbytes`` is the size requested (the storage's
bytes, before the allocator rounds it; 0 for a free), ``segment`` the number of the step segment it
happened in (estimator/trace.py; -1 before the first). Zero-byte storages never reach the allocator
(``CUDACachingAllocator::allocate`` returns a null pointer for them) and are not recorded.
"""

from __future__ import annotations

ALLOC, FREE = 0, 1

Event = tuple[int, int, int, int]  # (op, id, nbytes, segment)


class EventLog:
    """Allocations and frees in execution order; scratch buffers are marked as workspaces."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.next_id = 0
        self.workspaces: set[int] = set()  # ids of kernel scratch buffers (not tensors)

    def reserve_id(self) -> int:
        """The id the next allocation will get (``alloc`` must follow when it is used)."""
        return self.next_id

    def alloc(self, nbytes: int, segment: int, *, workspace: bool = False) -> int:
        eid = self.next_id
        self.next_id += 1
        self.events.append((ALLOC, eid, nbytes, segment))
        if workspace:
            self.workspaces.add(eid)
        return eid

    def free(self, eid: int, segment: int) -> None:
        self.events.append((FREE, eid, 0, segment))

    def scratch(self, sizes: list[int], segment: int) -> None:
        """A kernel's scratch buffers: allocated after its outputs, freed (last first) when it returns."""
        ids = [self.alloc(n, segment, workspace=True) for n in sizes if n > 0]
        for eid in reversed(ids):
            self.free(eid, segment)

    def drop(self, eid: int, segment: int) -> None:
        """A storage that is not device memory after all (an emulated host copy): unrecord its allocation."""
        last = self.events[-1] if self.events else None
        if last is not None and last[0] == ALLOC and last[1] == eid:
            self.events.pop()
        else:
            self.free(eid, segment)
