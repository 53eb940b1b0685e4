"""What tracing's import of transformers may leave out in the command line's process: scipy, which transformers'
object-detection losses import (``transformers.loss``, reached through ``PreTrainedModel``) when it is installed.

ckptbench depends on scipy (its statistics), so it is always installed where ckptbench is, and transformers imports
``scipy.optimize`` with every model class: 0.2-0.3 s of the 3.3-3.5 s a cold command's tracing import took on a
2-core machine (issue 38), for losses a causal LM never computes. While tracing's libraries are imported in the
command line's process (it ends with the command: no caller's code runs in it afterwards), transformers is told that
scipy is not installed (``transformers.utils.is_scipy_available``, the name those modules import, answers False),
and told the truth again right after: only the object-detection losses, which ckptbench never builds, are left
without it. ckptbench's own uses of scipy import it as always. A caller's process (the Python API's) imports
transformers as it is.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator

_LOSSES = "transformers.loss"  # the package whose modules ask, once each, at their import
_SWITCH = "is_scipy_available"  # what they ask: the name they import from transformers.utils


@contextlib.contextmanager
def without_scipy_for_transformers() -> Iterator[None]:
    """Inside the block, transformers' modules imported for the first time see scipy as not installed (where
    transformers' losses were imported already, or it has no such switch, nothing changes)."""
    if _LOSSES in sys.modules:
        yield
        return
    try:
        utils = importlib.import_module("transformers.utils")
    except ImportError:  # no transformers: the import that follows says so
        yield
        return
    asked = getattr(utils, _SWITCH, None)
    if asked is None:
        yield
        return
    setattr(utils, _SWITCH, _not_installed)
    try:
        yield
    finally:
        setattr(utils, _SWITCH, asked)


def _not_installed() -> bool:
    return False
