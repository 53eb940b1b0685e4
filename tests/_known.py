"""Narrowing for type checking: a value a test expects to be there (a record's measured peak, its loss check)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def known(value: T | None) -> T:
    """``value``, asserted present: a None fails the test here rather than as a TypeError further on."""
    assert value is not None
    return value
