"""Rendering of estimates: rich table, Markdown, CSV, JSON (no estimating here).

Every number shown is a prediction, and the output says so: the table title and header, the CSV
columns (``predicted_*``) and the JSON records (``"estimate": true``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from ckptbench.estimate.record import PART_NAMES, Estimate
from ckptbench.render.tables import csv_text, markdown_table
from ckptbench.results.inputs import Measured
from ckptbench.units import fmt_bytes

# Point axes shown when they vary across the estimated points (layout, batch and seq always).
_AXES = {
    "precision": "precision", "optimizer": "optimizer", "micro_batches": "micro", "offload": "offload",
    "lora": "lora", "compile": "compile", "attn_implementation": "attn", "allocator": "allocator",
}
_PARTS = {
    "params": "params", "grads": "grads", "optimizer_state": "optim", "activations": "activations",
    "logits_loss": "logits+loss", "transient": "transient", "other": "other",
}
_RESERVED = ["est. reserved", "measured reserved", "reserved error", "frag."]
_RIGHT = {"batch", "seq", "micro", "est. peak", "measured", "error", *_RESERVED, *_PARTS.values()}
Reserved = dict[str, int]  # measured peak reserved bytes by key_id (results.inputs.measured_reserved)


def _axes(estimates: Sequence[Estimate]) -> list[str]:
    return [a for a in _AXES if len({e.point.key[a] for e in estimates}) > 1]


def _size(n: int | None) -> str:
    return "0" if n == 0 else fmt_bytes(n)


def _fit(e: Estimate) -> str:
    if e.peak_bytes is None:
        return e.note or "-"
    oom = e.reserved.oom if e.reserved is not None else None
    if oom is not None:
        return f"no (out of memory: {oom.get('where') or oom['segment']}, {fmt_bytes(oom['request_bytes'])})"
    if e.fits is None:
        return "-"
    return "yes" if e.fits else f"no ({PART_NAMES[e.dominant or 'params']})"


def _error(e: Estimate, measured: Measured) -> float | None:
    peak = measured.get(e.point.key_id)
    return None if not isinstance(peak, int) or e.peak_bytes is None else (e.peak_bytes - peak) / peak


def _predicted_reserved(e: Estimate) -> int | None:
    return e.reserved.peak_reserved_bytes if e.reserved is not None else None


def _reserved_error(e: Estimate, reserved: Reserved) -> float | None:
    seen, predicted = reserved.get(e.point.key_id), _predicted_reserved(e)
    return None if seen is None or predicted is None else (predicted - seen) / seen


def _has_reserved(estimates: Sequence[Estimate]) -> bool:
    return any(e.reserved is not None for e in estimates)


def estimate_columns(
    estimates: Sequence[Estimate], measured: Measured | None = None, reserved: Reserved | None = None
) -> list[str]:
    """Display columns: point axes, the predicted peaks, the breakdown, where the peak happens, the fit."""
    cols = ["layout", "batch", "seq", *(_AXES[a] for a in _axes(estimates)), "est. peak"]
    cols += ["measured", "error"] if measured else []
    if _has_reserved(estimates):
        cols += ["est. reserved", *(["measured reserved", "reserved error"] if reserved else []), "frag."]
    cols += [*_PARTS.values(), "peak at"]
    if any(e.budget_bytes is not None for e in estimates) or any(e.note for e in estimates):
        cols.append("fits budget")
    return cols


def estimate_rows(
    estimates: Sequence[Estimate], measured: Measured | None = None, reserved: Reserved | None = None
) -> list[dict[str, str]]:
    """One display row per point: strings ready for any renderer."""
    axes, measured, reserved = _axes(estimates), measured or {}, reserved or {}
    rows = []
    for e in estimates:
        key = e.point.key
        row = {"layout": str(key["layout"]), "batch": str(key["batch_size"]), "seq": str(key["seq_len"])}
        row.update({_AXES[a]: str(key[a]) for a in axes})
        row["est. peak"] = _size(e.peak_bytes)
        error = _error(e, measured)
        seen = measured.get(e.point.key_id, "-")
        row["measured"] = _size(seen) if isinstance(seen, int) else seen
        row["error"] = "-" if error is None else f"{error:+.2%}"
        row.update(_reserved_cells(e, reserved))
        row.update({name: _size(e.breakdown.get(part)) for part, name in _PARTS.items()})
        row["peak at"] = e.peak_at or "-"
        row["fits budget"] = _fit(e)
        rows.append(row)
    return rows


def _reserved_cells(e: Estimate, reserved: Reserved) -> dict[str, str]:
    r, error = e.reserved, _reserved_error(e, reserved)
    seen = reserved.get(e.point.key_id)
    return {
        "est. reserved": "OOM" if r is not None and r.oom else _size(_predicted_reserved(e)),
        "measured reserved": "-" if seen is None else _size(seen),
        "reserved error": "-" if error is None else f"{error:+.2%}",
        "frag.": _size(r.fragmentation_bytes) if r is not None and r.fragmentation_bytes is not None else "-",
    }


def _title(estimates: Sequence[Estimate], name: str) -> str:
    target = estimates[0].target if estimates else "cuda"
    budget = next((e.budget_bytes for e in estimates if e.budget_bytes is not None), None)
    within = f", budget {fmt_bytes(budget)}" if budget is not None else ""
    card = next((e.reserved for e in estimates if e.reserved is not None), None)
    if card is None:
        what = f"predicted peak allocated memory on {target}"
    else:
        status = "measured figures" if card.gpu_measured else "card figures estimated"
        what = f"predicted peak allocated and reserved memory on {card.gpu} ({status})"
    return f"ckptbench estimate: {name} ({what}{within}; all numbers estimated)"


def estimate_table(
    estimates: Sequence[Estimate], *, name: str, measured: Measured | None = None, reserved: Reserved | None = None
) -> Table:
    """A rich table of estimates (and measurements, from a run); points that do not fit are yellow."""
    columns = estimate_columns(estimates, measured, reserved)
    table = Table(title=_title(estimates, name), header_style="bold")
    table.caption = "breakdown at the predicted peak; fake-tensor trace of the training step, not a measurement"
    for col in columns:
        table.add_column(col, justify="right" if col in _RIGHT else "left", no_wrap=col != "fits budget")
    for e, row in zip(estimates, estimate_rows(estimates, measured, reserved), strict=True):
        table.add_row(*(row[c] for c in columns), style="yellow" if e.fits is False else None)
    return table


def estimate_markdown(
    estimates: Sequence[Estimate], *, name: str = "", measured: Measured | None = None, reserved: Reserved | None = None
) -> str:
    """A Markdown section: title line, then the table."""
    columns = estimate_columns(estimates, measured, reserved)
    body = markdown_table(estimate_rows(estimates, measured, reserved), columns, right=_RIGHT)
    return f"**{_title(estimates, name)}**\n\n{body}"


def _records(
    estimates: Sequence[Estimate], measured: Measured | None, reserved: Reserved | None = None
) -> list[dict[str, Any]]:
    out = []
    for e in estimates:
        rec = e.to_record()
        if measured:
            seen = measured.get(e.point.key_id)
            rec["measured_peak_allocated_bytes"] = seen if isinstance(seen, int) else None
            rec["measured_status"] = "ok" if isinstance(seen, int) else seen
            rec["relative_error"] = _error(e, measured)
        if reserved:
            rec["measured_peak_reserved_bytes"] = reserved.get(e.point.key_id)
            rec["reserved_relative_error"] = _reserved_error(e, reserved)
        out.append(rec)
    return out


def estimate_json(
    estimates: Sequence[Estimate], *, name: str = "", measured: Measured | None = None, reserved: Reserved | None = None
) -> str:
    """A JSON list: one object per point with ``key``, the predicted peaks (allocated, reserved), the breakdown."""
    return json.dumps(_records(estimates, measured, reserved), sort_keys=True, indent=2) + "\n"


_RESERVED_KEYS = (
    "predicted_peak_reserved_bytes", "predicted_fragmentation_bytes", "predicted_num_alloc_retries", "gpu",
)


def estimate_csv(
    estimates: Sequence[Estimate], *, name: str = "", measured: Measured | None = None, reserved: Reserved | None = None
) -> str:
    """One flat row per point, raw bytes: ``predicted_at_peak_*`` is the breakdown at the peak,
    ``predicted_{params,grads,optimizer_state}_bytes`` the whole model's static memory."""
    rows: list[dict[str, Any]] = []
    for e, rec in zip(estimates, _records(estimates, measured, reserved), strict=True):
        row: dict[str, Any] = dict(e.point.key)
        row["predicted_peak_allocated_bytes"] = rec["predicted_peak_allocated_bytes"]
        if e.reserved is not None:
            row.update({k: rec[k] for k in _RESERVED_KEYS})
            row["predicted_context_bytes"] = rec["context_bytes"]  # the card model's figure, an estimate too
            oom = rec["predicted_oom"] or {}
            row.update({f"predicted_oom_{k}": oom.get(k) for k in ("phase", "segment", "request_bytes")})
        row.update({f"predicted_at_peak_{k}": v for k, v in rec["breakdown"].items()})
        row.update({f"predicted_{k}": v for k, v in rec["memory"].items()})
        row.update({k: rec[k] for k in ("peak_at", "budget_bytes", "fits", "reason", "note", "target", "method")})
        measured_keys = (
            "measured_peak_allocated_bytes", "measured_status", "relative_error", "measured_peak_reserved_bytes",
            "reserved_relative_error",
        )
        row.update({k: rec[k] for k in measured_keys if k in rec})
        rows.append(row)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return csv_text(rows, columns)


RENDERERS = {"markdown": estimate_markdown, "csv": estimate_csv, "json": estimate_json}
