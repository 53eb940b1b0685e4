"""The optional C part of the estimator (pyproject.toml holds everything else): the replayed caching allocator's
hot path. ``optional=True``: without a compiler the install goes on, and the estimator runs its pure-Python loop,
which gives the same bytes (tests/test_native.py), only slower."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ckptbench.estimator._replay_native",
            ["ckptbench/estimator/_replay_native.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
