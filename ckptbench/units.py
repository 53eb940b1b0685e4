"""Memory sizes on the command line and on screen: '80' means GiB, '512MiB', '5%' of a budget."""

from __future__ import annotations

import math
import re

from ckptbench.errors import ConfigError

GIB = 2**30
MIB = 2**20
_UNITS = {"": GIB, "b": 1, "kib": 2**10, "mib": MIB, "gib": GIB, "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str, *, what: str = "--budget", allow_zero: bool = False) -> int:
    """Bytes from '80' (GiB), '80GiB', '512MiB', '1.5 GiB'; positive and finite, else ConfigError."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else ""
    value = float(m.group(1)) if m else math.nan
    if unit not in _UNITS or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(
            f"{what}: {text!r} is not a memory size; give a positive number of GiB, e.g. 80, 80GiB or 512MiB"
        )
    return int(value * _UNITS[unit])


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
    """GiB for sizes of a GiB and more, MiB below (tiny CPU models)."""
    if n is None:
        return "-"
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.2f} MiB"
