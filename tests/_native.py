"""Whether the tests of the allocator's C fast path (``ckptbench.estimator._replay_native``) run: where it was built
(and not turned off with CKPTBENCH_NATIVE=0). CI sets CKPTBENCH_REQUIRE_NATIVE=1 (.ci/run): there a missing C part
fails the tests that ask for it instead of skipping them. The general rules, its reference, always run."""

from __future__ import annotations

import os

import pytest

from ckptbench.estimator.allocator import NATIVE

REQUIRED = os.environ.get("CKPTBENCH_REQUIRE_NATIVE") == "1"
WITH_NATIVE = pytest.mark.skipif(
    NATIVE is None and not REQUIRED,
    reason="the C part of the estimator is not built (pip install -e . builds it) or CKPTBENCH_NATIVE=0",
)
