"""Which of the allocator's ``serve`` loops the tests run: the pure-Python reference always, and the C one
(``ckptbench.estimator._replay_native``) when it was built. CI sets CKPTBENCH_REQUIRE_NATIVE=1 (.ci/run): there a
missing C part fails the tests that ask for it instead of skipping them."""

from __future__ import annotations

import os

import pytest

from ckptbench.estimator.allocator import NATIVE

REQUIRED = os.environ.get("CKPTBENCH_REQUIRE_NATIVE") == "1"
WITH_NATIVE = pytest.mark.skipif(
    NATIVE is None and not REQUIRED,
    reason="the C part of the estimator is not built (pip install -e . builds it) or CKPTBENCH_NATIVE=0",
)
SERVE_LOOPS = [pytest.param(False, id="python"), pytest.param(True, id="c", marks=WITH_NATIVE)]
