"""The optional C part of the estimator (pyproject.toml holds everything else): the replayed caching allocator's
fast path. ``optional``: without a compiler the install goes on, and the estimator runs every request through its
general rules, which give the same bytes (tests/test_native.py), only slower. With CKPTBENCH_REQUIRE_NATIVE=1 (CI,
.ci/run) a failed build fails the install, warnings included where CFLAGS has -Werror.

The build carries the source's fingerprint (``native_fingerprint.py``): allocator.py does not use a build older than
the source beside it."""

import os
import runpy
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "ckptbench/estimator/_replay_native.c"
source_hash = runpy.run_path(str(HERE / "ckptbench/estimator/native_fingerprint.py"))["source_hash"](SOURCE)

setup(
    ext_modules=[
        Extension(
            "ckptbench.estimator._replay_native",
            ["ckptbench/estimator/_replay_native.c"],
            optional=os.environ.get("CKPTBENCH_REQUIRE_NATIVE") != "1",
            define_macros=[("CKPTBENCH_SOURCE_HASH", f'"{source_hash}"')],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
        )
    ]
)
