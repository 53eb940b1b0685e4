"""Rendering of `ckptbench gpus`: the card table with every figure's source (no figures made here)."""

from __future__ import annotations

import json

from ckptbench.config.cards import CARDS, Card
from ckptbench.json_object import JsonObject
from ckptbench.render.tables import Column, FitTable, csv_text, markdown_of, names

# The figures first; the sources give way at 80 columns (Markdown, CSV and JSON hold them all).
_SOURCES = ("memory source", "context source", "flops source", "bandwidth source")
COLUMNS = [
    Column("key"), Column("memory", numeric=True, keep=1), Column("context", numeric=True, keep=2),
    Column("bf16 TFLOP/s", numeric=True, keep=3), Column("TB/s", numeric=True, keep=4),
    Column("capability", priority=1),
    Column("name", priority=2, wrap=True, min_width=12),
    *(Column(name, priority=9, wrap=True, min_width=30) for name in _SOURCES),
]


def _row(card: Card) -> dict[str, str]:
    return {
        "key": card.key,
        "memory": f"{card.memory_bytes / 2**30:.2f} GiB",
        "context": "-" if card.context_bytes is None else f"{card.context_bytes / 2**30:.2f} GiB",
        "bf16 TFLOP/s": "-" if card.bf16_tflops is None else f"{card.bf16_tflops:g}",
        "TB/s": f"{card.bandwidth_bytes_per_s / 1e12:g}",
        "capability": f"{card.capability[0]}.{card.capability[1]}",
        "name": card.name,
        "memory source": card.memory_source,
        "context source": card.context_source or "none published (advise uses its architecture's: see --format json)",
        "flops source": card.flops_source,
        "bandwidth source": card.bandwidth_source,
    }


CAPTION = ("memory: total as torch reports it; context: outside the caching allocator (- none published); bf16: dense "
           "tensor-core peak; every figure's source: --format markdown, csv or json")


def gpus_table() -> FitTable:
    return FitTable([_row(c) for c in CARDS], COLUMNS, title=f"{len(CARDS)} cards (config/cards.py)",
                    caption=CAPTION, title_justify="left")


def gpus_markdown() -> str:
    return markdown_of([_row(c) for c in CARDS], COLUMNS)


def gpus_csv() -> str:
    rows: list[dict[str, object]] = [dict(_row(c)) for c in CARDS]
    return csv_text(rows, names(COLUMNS))


def gpus_json() -> str:
    from ckptbench.estimator.gpus import GPUS

    def one(card: Card) -> JsonObject:
        model = GPUS[card.key]
        return {
            "key": card.key, "aliases": list(card.aliases), "name": card.name, "names": list(card.names),
            "capability": list(card.capability), "measured": card.measured,
            "memory_bytes": {"value": card.memory_bytes, "source": card.memory_source},
            # What advise and estimate count (an architecture's figure where the card has none published).
            "context_bytes": {"value": model.context_bytes, "source": model.context_source},
            "bf16_tflops": {"value": card.bf16_tflops, "source": card.flops_source},
            "fp16_tflops": {"value": card.fp16_tflops, "source": card.flops_source},
            "bandwidth_bytes_per_s": {"value": card.bandwidth_bytes_per_s, "source": card.bandwidth_source},
            "notes": card.notes,
        }

    return json.dumps([one(c) for c in CARDS], indent=2, sort_keys=True) + "\n"
