"""Memory sizes on the command line and on screen: '80' means GiB, '512MiB', '5%' of a budget.

Display rule (one for every table, sentence and plot of an output): sizes are shown in **GiB with
two decimals**, unless every size the output shows is below 1 GiB (tiny CPU models), then in MiB
with two decimals, so that their differences stay visible. ``SizeUnit.for_sizes`` makes that choice
once per output and every size of the output is formatted with it; a zero is "0.00 GiB", never "0".
``fmt_bytes`` (chosen per value) is only for a lone size in a message: errors, progress lines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ckptbench.errors import ConfigError

GIB = 2**30
MIB = 2**20
_UNITS = {"": GIB, "b": 1, "kib": 2**10, "mib": MIB, "gib": GIB, "tib": 2**40}
# Decimal or bare-letter units: '80GB' is 80e9 bytes to a disk vendor and 80 * 2**30 to nvidia-smi.
_AMBIGUOUS = {"k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
# "CUDA out of memory. Tried to allocate 1.95 GiB." / "CPU tracker: tried to allocate 0.69 MiB in ..."
_TRIED = re.compile(r"tried to allocate\s+([0-9]*\.?[0-9]+)\s*(B|KiB|MiB|GiB|TiB)\b", re.IGNORECASE)


def parse_size(text: str, *, what: str = "--budget", allow_zero: bool = False) -> int:
    """Bytes from '80' (GiB), '80GiB', '512MiB', '1.5 GiB'; positive and finite, else ConfigError."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else ""
    value = float(m.group(1)) if m else math.nan
    if m and unit in _AMBIGUOUS and math.isfinite(value):
        raise ConfigError(_ambiguous(what, text, value, unit))
    if unit not in _UNITS or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(
            f"{what}: {text!r} is not a memory size; give a positive number of GiB, e.g. 80, 80GiB or 512MiB"
        )
    return int(value * _UNITS[unit])


def _ambiguous(what: str, text: str, value: float, unit: str) -> str:
    binary = {"k": "KiB", "m": "MiB", "g": "GiB", "t": "TiB"}[unit[0]]
    decimal = value * _AMBIGUOUS[unit] / _UNITS[binary.lower()]
    return (
        f"{what}: {text!r} is ambiguous ({unit.upper()} is 10^{round(math.log10(_AMBIGUOUS[unit]))} bytes to some "
        f"tools and 2^{round(math.log2(_UNITS[binary.lower()]))} to others); use {binary}: "
        f"{value:g}{binary}, or {decimal:.2f}{binary} for {value:g} x 10^{round(math.log10(_AMBIGUOUS[unit]))} bytes"
    )


def parse_headroom(text: str, *, budget_bytes: int) -> int:
    """Bytes to keep free under the budget: 'N%' of the budget, or a size as in parse_size."""
    raw = str(text).strip()
    if raw.endswith("%"):
        try:
            pct = float(raw[:-1])
        except ValueError:
            pct = -1.0
        if not 0 <= pct < 100:
            raise ConfigError(f"--headroom: {text!r} is not a percentage in [0, 100), e.g. 5%")
        return int(budget_bytes * pct / 100)
    headroom = parse_size(raw, what="--headroom", allow_zero=True)
    if headroom >= budget_bytes:
        raise ConfigError(f"--headroom: {text} leaves nothing of the {fmt_bytes(budget_bytes)} budget")
    return headroom


def fmt_bytes(n: float | None) -> str:
    """A lone size in a message: GiB for a GiB and more, MiB below. Tables use ``SizeUnit``."""
    if n is None:
        return "-"
    return f"{_over(n, GIB):.2f} GiB" if abs(n) >= GIB else f"{_over(n, MIB):.2f} MiB"


def _over(n: float, scale: int) -> float:
    """``n / scale``, infinite instead of an OverflowError for an integer beyond a float (a damaged record)."""
    try:
        return n / scale
    except OverflowError:
        return math.inf if n > 0 else -math.inf


@dataclass(frozen=True)
class SizeUnit:
    """The one unit of an output's sizes (see the module docstring); calling it formats a size."""

    name: str
    scale: int

    @classmethod
    def for_sizes(cls, sizes: Iterable[float | None]) -> SizeUnit:
        """GiB, unless every size given is below 1 GiB (then MiB)."""
        largest = max((abs(s) for s in sizes if s is not None and s == s), default=None)
        return MIB_UNIT if largest is not None and largest < GIB else GIB_UNIT

    def __call__(self, n: float | None, *, signed: bool = False) -> str:
        """'1.23 GiB' ('+1.23 GiB' when signed); '-' for a missing size; never '-0.00'."""
        if n is None or n != n:
            return "-"
        value = _over(n, self.scale)
        if math.isfinite(value) and round(value, 2) == 0:
            return f"0.00 {self.name}"
        return f"{value:{'+' if signed else ''}.2f} {self.name}"

    def value(self, n: float) -> float:
        """``n`` bytes in this unit (for plot axes)."""
        return _over(n, self.scale)


GIB_UNIT = SizeUnit("GiB", GIB)
MIB_UNIT = SizeUnit("MiB", MIB)


def fmt_percent(fraction: float | None, *, digits: int = 2, signed: bool = False) -> str:
    """'12.34%' ('+12.34%' when signed) of a fraction; anything that rounds to zero is '0.00%', never '-0.00%'."""
    if fraction is None or fraction != fraction:
        return "-"
    pct = fraction * 100
    if round(pct, digits) == 0:
        return f"{0:.{digits}f}%"
    return f"{pct:{'+' if signed else ''}.{digits}f}%"


def tried_allocation_bytes(message: str | None) -> int | None:
    """The size an out-of-memory message says it tried to allocate (CUDA's and the CPU tracker's)."""
    m = _TRIED.search(message or "")
    if m is None:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
