"""PYTORCH_CUDA_ALLOC_CONF as data: the caching allocator's options, parsed as torch parses them. No torch.

The grammar and the checks follow torch's own parser (c10/core/AllocatorConfig.cpp,
``AcceleratorAllocatorConfig::parseArgs`` and its ``parse*`` helpers, torch 2.9-2.14; before 2.9 the
same rules lived in c10/cuda/CUDAAllocatorConfig.cpp): comma-separated ``key:value`` pairs, list
values in brackets, whitespace ignored, unknown keys skipped. The ``allocator`` sweep axis names a
setting in short form (``expandable_segments``, ``max_split_size_mb:256``) that ``axis_to_conf``
turns into the variable's text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MIB = 2**20
KLARGE_BUFFER = 20 * MIB  # kLargeBuffer: 1-10 MiB requests get a segment of this size (the default)
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: one division count per power of two, 1 MiB .. 32 GiB
_ROUNDUP_START_LOG2 = 20  # the intervals start at 1 MiB (kRoundUpPowerOfTwoStart)
# Axis values: 'default' or comma-separated items; 'expandable_segments' alone means ':True'.
AXIS_PATTERN = r"^(default|[a-z_0-9.:\[\]>,]+)$"
_KNOWN = (
    "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "expandable_segments", "large_segment_size_mb",
    "per_process_memory_fraction",
)


@dataclass(frozen=True)
class AllocatorSettings:
    """The options that change where the caching allocator puts a block (all sizes in bytes)."""

    max_split_size: int | None = None  # None: any block may be split (torch's SIZE_MAX)
    max_non_split_rounding: int = KLARGE_BUFFER  # an oversize block serves requests this much smaller
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * ROUNDUP_INTERVALS)
    garbage_collection_threshold: float = 0.0  # 0: off (it also needs a memory fraction to be set)
    expandable_segments: bool = False
    large_segment_size: int = KLARGE_BUFFER  # 'large_segment_size_mb' (torch 2.13+; 20 MiB before)
    per_process_memory_fraction: float | None = None  # torch 2.12+ accepts it in the variable

    def divisions(self, size: int) -> int:
        """Power-of-two divisions for a request of ``size`` bytes (``roundup_power2_divisions(size)``)."""
        index = max(size.bit_length() - 1 - _ROUNDUP_START_LOG2, 0)
        return self.roundup_power2_divisions[min(index, ROUNDUP_INTERVALS - 1)]


def _tokens(text: str) -> list[str]:
    """ConfigTokenizer: keys, values and the separators ':', ',', '[' and ']'; whitespace dropped."""
    return [t for t in re.split(r"([,:\[\]])", re.sub(r"\s+", "", text)) if t]


def _mb(key: str, value: str) -> int:
    # parseMaxSplitSize / parseMaxNonSplitRoundingSize: at least kLargeBuffer (20 MiB), in MiB.
    number = _int(key, value)
    if number < KLARGE_BUFFER // MIB:
        raise ValueError(f"{key} too small, must be >= {KLARGE_BUFFER // MIB}")
    return number * MIB


def _int(key: str, value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{key}: {value!r} is not a whole number")
    return int(value)


def _power_of_two(key: str, value: str, *, zero_ok: bool) -> int:
    number = _int(key, value)
    if not ((zero_ok and number == 0) or (number > 0 and number & (number - 1) == 0)):
        raise ValueError(f"{key}: {number} must be a power of 2" + (" or 0" if zero_ok else ""))
    return number


def _divisions(tokens: list[str], i: int) -> tuple[tuple[int, ...], int]:
    """parseRoundUpPower2Divisions: one count for all sizes, or '[64:8,256:4,>:1]' by size in MiB."""
    key = "roundup_power2_divisions"
    if tokens[i] != "[":
        return (_power_of_two(key, tokens[i], zero_ok=False),) * ROUNDUP_INTERVALS, i
    values = [0] * ROUNDUP_INTERVALS
    first, last = True, 0
    i += 1
    while i < len(tokens) and tokens[i] != "]":
        bound, colon, count = tokens[i], tokens[i + 1 : i + 2], tokens[i + 2 : i + 3]
        if colon != [":"] or not count:
            raise ValueError(f"{key}: expected 'SIZE_MB:DIVISIONS' entries, got {bound!r}")
        divisions = _power_of_two(key, count[0], zero_ok=True)
        if bound == ">":
            values[last + 1 :] = [divisions] * (ROUNDUP_INTERVALS - last - 1)
        else:
            index = min(max(_power_of_two(key, bound, zero_ok=False).bit_length() - 1, 0), ROUNDUP_INTERVALS - 1)
            if first:  # sizes below the first bound take its count too
                values[:index] = [divisions] * index
                first = False
            values[index], last = divisions, index
        i += 3
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    if i >= len(tokens):
        raise ValueError(f"{key}: expected a closing ']'")
    return tuple(values), i


def _bool(key: str, value: str) -> bool:
    if value not in ("True", "False"):  # ConfigTokenizer::toBool accepts exactly these
        raise ValueError(f"{key}: expected True or False, got {value!r}")
    return value == "True"


def _fraction(key: str, value: str, *, low_open: bool) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{key}: {value!r} is not a number") from None
    ok = math.isfinite(number) and (0 < number < 1 if low_open else 0 <= number <= 1)
    if not ok:
        raise ValueError(f"{key}: {number} must be in {'(0.0, 1.0)' if low_open else '[0.0, 1.0]'}")
    return number


def _value(key: str, tokens: list[str], i: int, out: dict[str, object]) -> int:
    """Parse the value of ``key`` starting at ``tokens[i]``; store it in ``out``; the last index used."""
    value = tokens[i] if i < len(tokens) else ""
    if key == "roundup_power2_divisions":
        out[key], i = _divisions(tokens, i)
    elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        out[key] = _mb(key, value)
    elif key == "large_segment_size_mb":
        out[key] = _int(key, value) * MIB
    elif key == "garbage_collection_threshold":
        out[key] = _fraction(key, value, low_open=True)
    elif key == "per_process_memory_fraction":
        out[key] = _fraction(key, value, low_open=False)
    elif key == "expandable_segments":
        out[key] = _bool(key, value)
    elif value == "[":  # an option this model does not need (backend, pinned_*): skipped as torch does
        while i < len(tokens) and tokens[i] != "]":
            i += 1
    return i


def _parse(text: str) -> tuple[dict[str, object], list[str]]:
    """The options of a PYTORCH_CUDA_ALLOC_CONF value by key, and the keys it skipped."""
    tokens, found, skipped = _tokens(text), dict[str, object](), list[str]()
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if tokens[i + 1 : i + 2] != [":"]:
            raise ValueError(f"expected 'key:value', got {key!r}")
        if key not in _KNOWN:
            skipped.append(key)
        i = _value(key, tokens, i + 2, found)
        if i + 1 < len(tokens) and tokens[i + 1] != ",":
            raise ValueError(f"{key}: expected ',' after its value, got {tokens[i + 1]!r}")
        i += 2
    return found, skipped


def parse_alloc_conf(text: str) -> AllocatorSettings:
    """The settings a PYTORCH_CUDA_ALLOC_CONF value gives; ValueError naming the bad option.

    Options that do not move blocks (backend, pinned_*, release_lock_on_cudamalloc) are skipped.
    """
    found, _ = _parse(text)
    names = {
        "max_split_size_mb": "max_split_size", "max_non_split_rounding_mb": "max_non_split_rounding",
        "large_segment_size_mb": "large_segment_size",
    }
    return AllocatorSettings(**{names.get(k, k): v for k, v in found.items()})  # type: ignore[arg-type]


def axis_to_conf(value: str) -> str:
    """The PYTORCH_CUDA_ALLOC_CONF text of an ``allocator`` axis value ('' for 'default')."""
    if value == "default":
        return ""
    items = [item.strip() for item in value.split(",")]
    return ",".join("expandable_segments:True" if item == "expandable_segments" else item for item in items)


def check_axis_value(value: str) -> str:
    """Validate an ``allocator`` axis value (ValueError with the reason); returns it unchanged."""
    if not re.fullmatch(AXIS_PATTERN, value):
        raise ValueError(f"{value!r} is not 'default' or allocator options such as 'expandable_segments'")
    _, skipped = _parse(axis_to_conf(value))
    if skipped:
        raise ValueError(f"{skipped[0]!r} is not an allocator option ckptbench models; known: {', '.join(_KNOWN)}")
    return value
