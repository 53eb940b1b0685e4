"""What tracing's import of transformers may leave out, or do once, in the command line's process.

- **scipy**, which transformers' object-detection losses import (``transformers.loss``, reached through
  ``PreTrainedModel``) when it is installed. ckptbench depends on scipy (its statistics), so it is always installed
  where ckptbench is, and transformers imports ``scipy.optimize`` with every model class: 0.2-0.3 s of the 3.3-3.5 s a
  cold command's tracing import took on a 2-core machine (issue 38), for losses a causal LM never computes. While
  tracing's libraries are imported in the command line's process (it ends with the command: no caller's code runs in
  it afterwards), transformers is told that scipy is not installed (``transformers.utils.is_scipy_available``, the
  name those modules import, answers False), and told the truth again right after: only the object-detection losses,
  which ckptbench never builds, are left without it. ckptbench's own uses of scipy import it as always.
- **the second scan of its models folder**. To know what each of its ~400 models exports, transformers reads every
  model's source files (``create_import_structure_from_path``, kept in an ``lru_cache``): once for the top-level
  package (given the folder) and once more for ``transformers.models`` (given the folder's ``__init__.py``, which it
  turns into the same folder itself: the cache, keyed by the argument, does not know it). While the command line's
  process imports transformers, ``transformers.models`` asks with the folder as the top-level package did, and gets
  its scan from the cache: 0.23 s of a cold command, and the same structure (tests/test_speed.py compares it with a
  scan of its own). Where the cache let it go meanwhile, or transformers does this otherwise, it scans as before.

A caller's process (the Python API's) imports transformers as it is.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_LOSSES = "transformers.loss"  # the package whose modules ask, once each, at their import
_SWITCH = "is_scipy_available"  # what they ask: the name they import from transformers.utils
_DEFINE = "define_import_structure"  # what transformers.models asks for its structure


@contextlib.contextmanager
def lighter_transformers_import() -> Iterator[None]:
    """Inside the block, transformers imported for the first time without scipy and with its models folder scanned
    once (the module docstring): what the command line's tracing import asks for."""
    with without_scipy_for_transformers(), models_scanned_once():
        yield


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


@contextlib.contextmanager
def models_scanned_once() -> Iterator[None]:
    """Inside the block, ``transformers.models``, imported for the first time, takes the scan of its folder that the
    top-level package made (transformers' own cache of it) rather than making it again (see the module docstring)."""
    if "transformers.models" in sys.modules:
        yield
        return
    try:
        utils = importlib.import_module("transformers.utils.import_utils")
    except ImportError:
        yield
        return
    define = getattr(utils, _DEFINE, None)
    scan = getattr(utils, "create_import_structure_from_path", None)
    if define is None or not hasattr(scan, "cache_info") or utils.__file__ is None:
        yield
        return
    folder = Path(utils.__file__).parent.parent / "models"  # as transformers/__init__.py names it
    init = folder / "__init__.py"

    def asked(module_path: Any, prefix: str | None = None) -> Any:
        return define(folder if Path(module_path) == init else module_path, prefix)

    setattr(utils, _DEFINE, asked)
    try:
        yield
    finally:
        setattr(utils, _DEFINE, define)
