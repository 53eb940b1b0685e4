"""Set a predicted allocator snapshot beside a recorded one: their segments at the peak reserved, size by size.

    python scripts/compare_snapshots.py PREDICTED.pickle RECORDED.pickle [--out FILE.md]

PREDICTED is what `ckptbench estimate --snapshot` wrote for a point; RECORDED is what `ckptbench trace-allocator
--snapshot-from` made of the same point's trace recorded on a GPU. Both hold ``segments`` as they stood at the
peak reserved (torch.cuda.memory._snapshot()'s format). Prints (and with --out writes) a markdown table of every
segment size with how many segments of that size each side holds, then the totals; exits 0 when the two sets of
segment sizes are equal, 1 when they differ (the table says where), 2 on unreadable input.
"""

from __future__ import annotations

import pickle
import sys
from collections import Counter
from pathlib import Path
from typing import Any

MIB = 2**20
GIB = 2**30


def segment_sizes(snapshot: dict[str, Any]) -> Counter[int]:
    """How many segments of each size the snapshot holds."""
    return Counter(int(seg["total_size"]) for seg in snapshot["segments"])


def _load(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        data = pickle.load(f)  # our own files: estimate --snapshot, trace-allocator --snapshot-from
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise ValueError(f"{path}: not a torch.cuda.memory._snapshot() pickle (no 'segments' list)")
    return data


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB" if n % MIB == 0 else f"{n / MIB:.2f} MiB"


def compare(predicted: Counter[int], recorded: Counter[int]) -> tuple[bool, list[str]]:
    """(equal, markdown lines): one row per segment size, then the totals."""
    rows = ["| segment size | predicted | recorded | difference |", "|---:|---:|---:|---:|"]
    for size in sorted(set(predicted) | set(recorded), reverse=True):
        p, r = predicted[size], recorded[size]
        rows.append(f"| {_size(size)} ({size} B) | {p} | {r} | {p - r:+d} |")
    p_total = sum(s * n for s, n in predicted.items())
    r_total = sum(s * n for s, n in recorded.items())
    rows.append(f"| **total** | {sum(predicted.values())} segments, {_size(p_total)} | "
                f"{sum(recorded.values())} segments, {_size(r_total)} | {(p_total - r_total) / MIB:+.0f} MiB |")
    equal = predicted == recorded
    verdict = ("Equal: the same segment sizes, as many of each." if equal else
               f"Different: {sum((predicted - recorded).values())} predicted segment(s) not recorded, "
               f"{sum((recorded - predicted).values())} recorded segment(s) not predicted; reserved "
               f"{(p_total - r_total) / r_total:+.2%} against the recorded {_size(r_total)}.")
    return equal, [*rows, "", verdict]


def main(argv: list[str]) -> int:
    args = list(argv)
    out: Path | None = None
    if "--out" in args:
        i = args.index("--out")
        if i + 1 >= len(args):
            print("compare_snapshots: --out needs a file", file=sys.stderr)
            return 2
        out = Path(args[i + 1])
        del args[i : i + 2]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        pred, rec = (_load(Path(a)) for a in args)
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
        print(f"compare_snapshots: {exc}", file=sys.stderr)
        return 2
    equal, lines = compare(segment_sizes(pred), segment_sizes(rec))
    title = f"# Segments at the peak reserved: {Path(args[0]).name} (predicted) vs {Path(args[1]).name} (recorded)"
    text = "\n".join([title, "", *lines]) + "\n"
    sys.stdout.write(text)
    if out is not None:
        out.write_text(text, encoding="utf-8")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
