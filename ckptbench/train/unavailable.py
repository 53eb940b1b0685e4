"""The one exception for a technique that cannot run here: the point is skipped, not failed."""

from __future__ import annotations


class TechniqueUnavailable(RuntimeError):
    """A technique's package is not installed, or it cannot run on this device: the point is skipped.

    The message says which package or device it needs, so a skipped point explains itself.
    """
