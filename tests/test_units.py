"""One display style for sizes and percentages; sizes on the command line; the size in an OOM message."""

from __future__ import annotations

import pytest

from ckptbench.errors import ConfigError
from ckptbench.units import GIB, GIB_UNIT, MIB, MIB_UNIT, SizeUnit, fmt_percent, parse_size, tried_allocation_bytes


def test_one_unit_per_output_gib_unless_everything_is_small() -> None:
    assert SizeUnit.for_sizes([1010.22 * MIB, 62 * GIB]) is GIB_UNIT
    assert SizeUnit.for_sizes([0.99 * GIB, 25 * MIB, None]) is MIB_UNIT
    assert SizeUnit.for_sizes([GIB]) is GIB_UNIT  # exactly 1 GiB is shown in GiB
    assert SizeUnit.for_sizes([]) is GIB_UNIT
    # the same activation reads the same everywhere once the output's unit is chosen
    assert GIB_UNIT(1010.22 * MIB) == "0.99 GiB"
    assert MIB_UNIT(1010.22 * MIB) == "1010.22 MiB"


@pytest.mark.parametrize(
    ("n", "signed", "text"),
    [(0, False, "0.00 GiB"), (1, True, "0.00 GiB"), (-(2**20), True, "0.00 GiB"), (GIB, True, "+1.00 GiB"),
     (-3 * GIB // 2, True, "-1.50 GiB"), (62 * GIB, False, "62.00 GiB"), (None, False, "-")],
)
def test_size_text_never_signs_a_zero(n: int | None, signed: bool, text: str) -> None:
    assert GIB_UNIT(n, signed=signed) == text


@pytest.mark.parametrize(
    ("fraction", "signed", "text"),
    [(-4e-7, True, "0.00%"), (4e-7, True, "0.00%"), (0.012345, True, "+1.23%"), (-0.012345, True, "-1.23%"),
     (0.457, False, "45.70%"), (None, True, "-"), (float("nan"), False, "-")],
)
def test_percent_never_shows_minus_zero(fraction: float | None, signed: bool, text: str) -> None:
    assert fmt_percent(fraction, signed=signed) == text


def test_percent_digits() -> None:
    assert fmt_percent(0.4567, digits=1) == "45.7%"
    assert fmt_percent(-0.0004, digits=1, signed=True) == "0.0%"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 139.80 GiB", int(1.95 * GIB)),
        ("CPU tracker: tried to allocate 0.69 MiB in aten.mm.default with 45.76 MiB live", int(0.69 * MIB)),
        ("CUDA out of memory. Tried to allocate 20.00 MiB", 20 * MIB),
        ("batch 16 already ran out of memory", None),
        (None, None),
    ],
)
def test_tried_allocation_from_oom_messages(message: str | None, expected: int | None) -> None:
    assert tried_allocation_bytes(message) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("80GB", "use GiB: 80GiB, or 74.51GiB for 80 x 10^9 bytes"), ("80G", "use GiB"),
     ("512MB", "use MiB: 512MiB, or 488.28MiB"), ("2TB", "use TiB")],
)
def test_decimal_units_are_refused_with_the_reason(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="ambiguous") as info:
        parse_size(text)
    assert fragment in str(info.value) and str(info.value).startswith(f"--budget: {text!r} is ambiguous")
