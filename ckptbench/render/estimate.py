"""Rendering of estimates: rich table, Markdown, CSV, JSON (no estimating here).

Every number shown is a prediction unless its column says 'measured' (a run's own figures beside the
predictions), and the output says so: the table title and header, the CSV columns (``predicted_*``,
``measured_*``) and the JSON records (``"estimate": true``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ckptbench.analysis.step_time import NO_TIME, StepTimePrediction
from ckptbench.config.grid import AXIS_DEFAULTS, setup_label
from ckptbench.estimator.record import PART_NAMES, Estimate
from ckptbench.render.tables import Column, FitTable, csv_text, markdown_of
from ckptbench.results.inputs import Measured
from ckptbench.units import SizeUnit, fmt_percent

# Point axes shown when they vary across the estimated points (layout, batch and seq always):
# precision in its own column, the technique axes together in 'setup' (as in the sweep summary).
_TECHNIQUES = tuple(AXIS_DEFAULTS)
# The breakdown at the peak, and how soon each part gives way in a narrow terminal.
_PARTS = {
    "params": ("params", 4), "grads": ("grads", 2), "optimizer_state": ("optim", 4),
    "activations": ("activations", 2), "logits_loss": ("logits+loss", 3), "transient": ("transient", 5),
    "other": ("other", 5),
}
Reserved = dict[str, int]  # measured peak reserved bytes by key_id (results.inputs.measured_reserved)
# Step times predicted by the step-time model (estimate --times-from), by key_id; None: not determined.
Times = dict[str, StepTimePrediction | None]
STEP_COLUMN, TOKENS_COLUMN = "step (predicted)", "tok/s (predicted)"


def time_cells(prediction: StepTimePrediction | None) -> dict[str, str]:
    """The predicted step time ('412 ms ±3.9%' fitted; 'mod.' modelled in another cell, 'transf.' carried to another
    card) and tokens/s."""
    if prediction is None:
        return {STEP_COLUMN: "-", TOKENS_COLUMN: "-"}
    bound = prediction.error_bound
    mark = {"modelled": " mod.", "transferred": " transf."}.get(prediction.label, "")
    mark += f" ±{bound:.1%}" if bound is not None else ""
    return {STEP_COLUMN: f"{prediction.step_time_s * 1e3:,.0f} ms{mark}",
            TOKENS_COLUMN: f"{prediction.tokens_per_s:,.0f}"}


def _axes(estimates: Sequence[Estimate]) -> list[str]:
    return [a for a in ("precision", *_TECHNIQUES) if len({e.point.key[a] for e in estimates}) > 1]


def _setup(key: dict[str, Any], axes: Sequence[str]) -> str:
    """The varying technique axes of a key that differ from plain training ('-' for plain training)."""
    return setup_label({a: key[a] for a in axes if a in _TECHNIQUES}) or "-"


def _fit(e: Estimate, size: SizeUnit) -> str:
    if e.peak_bytes is None:
        return e.note or "-"
    oom = e.reserved.oom if e.reserved is not None else None
    if oom is not None:
        return f"no (out of memory: {oom.get('where') or oom['segment']}, {size(oom['request_bytes'])})"
    if e.fits is None:
        return "-"
    on = " on the bound" if e.reserved_bound_bytes is not None else ""
    return f"yes{on}" if e.fits else f"no{on} ({PART_NAMES[e.dominant or 'params']})"


def _error(e: Estimate, measured: Measured) -> float | None:
    peak = measured.get(e.point.key_id)
    return None if not isinstance(peak, int) or e.peak_bytes is None else (e.peak_bytes - peak) / peak


def _predicted_reserved(e: Estimate) -> int | None:
    return e.reserved.peak_reserved_bytes if e.reserved is not None else None


def _reserved_error(e: Estimate, reserved: Reserved) -> float | None:
    seen, predicted = reserved.get(e.point.key_id), _predicted_reserved(e)
    return None if seen is None or predicted is None else (predicted - seen) / seen


def _reserved_columns(
    estimates: Sequence[Estimate], reserved: Reserved | None, *, with_measured: bool = False
) -> list[Column]:
    if not any(e.reserved is not None for e in estimates):
        return []
    # Beside a run's measurements the allocated comparison (measured, error) comes first at 80 columns; on a card
    # with a budget the verdict (needed, fits) does.
    cols = [Column("est. reserved", priority=1 if with_measured or _verdicts(estimates) else 0, numeric=True, keep=2)]
    if any(e.reserved_bound_bytes is not None for e in estimates):  # what 'fits budget' is judged on
        cols.append(Column("reserved bound", priority=2 if _verdicts(estimates) else 1, numeric=True))
    if reserved:
        cols += [Column("measured reserved", priority=1, numeric=True)]
        cols += [Column("reserved error", priority=1, numeric=True)]
    return [*cols, Column("frag.", priority=2, numeric=True)]


def _verdicts(estimates: Sequence[Estimate]) -> bool:
    """Whether the table leads with the verdict columns: a card's allocator replayed, and a budget to judge."""
    return any(e.reserved is not None and e.budget_bytes is not None for e in estimates)


def _reserved_cells(e: Estimate, reserved: Reserved, size: SizeUnit) -> dict[str, str]:
    r, seen = e.reserved, reserved.get(e.point.key_id)
    frag = r.fragmentation_bytes if r is not None else None
    oom = r is not None and r.oom is not None
    return {
        "needed": "OOM" if oom else size(e.needed_bytes),
        "fits": "?" if e.fits is None else ("yes" if e.fits else "no"),
        "est. reserved": "OOM" if r is not None and r.oom else size(_predicted_reserved(e)),
        "reserved bound": size(e.reserved_bound_bytes),
        "measured reserved": size(seen),
        "reserved error": fmt_percent(_reserved_error(e, reserved), signed=True),
        "frag.": size(frag),
    }


def estimate_columns(
    estimates: Sequence[Estimate], measured: Measured | None = None, reserved: Reserved | None = None,
    times: Times | None = None,
) -> list[Column]:
    """Display columns: point axes, the predicted peaks (allocated, reserved), the breakdown, where the peak
    happens, the fit."""
    axes = _axes(estimates)
    setup = bool(set(axes) & set(_TECHNIQUES))
    # With a setup column the text columns fold ('every:2@' over 'selective') so that no number is cut.
    cols = [Column("layout", wrap=True, min_width=9, breaks="@", fold=True) if setup else Column("layout")]
    # Narrower than the always-shown columns (40 columns): the point (layout, batch, seq) and its predicted peak
    # stay; precision and setup go first, then the verdict and the measurement (keep).
    cols += [Column("batch", numeric=True, keep=1), Column("seq", numeric=True, keep=1)]
    cols += [Column("precision", keep=3)] if "precision" in axes else []
    cols += [Column("setup", wrap=True, min_width=10, breaks="=_", fold=True, keep=3)] if setup else []
    cols.append(Column("est. peak", numeric=True))
    if _verdicts(estimates):  # on a card with a budget: what must fit, and whether it does, kept at 80 columns
        cols += [Column("needed", numeric=True, keep=2), Column("fits", keep=2)]
    if measured:
        # Comparing the prediction with the run's measurement is why a run directory is passed: always shown.
        cols += [Column("measured", numeric=True, keep=2), Column("error", numeric=True, keep=2)]
    cols += _reserved_columns(estimates, reserved, with_measured=bool(measured))
    cols += [Column(STEP_COLUMN, priority=1, numeric=True), Column(TOKENS_COLUMN, priority=2, numeric=True)] \
        if times is not None else []
    cols += [Column(name, priority=prio, numeric=True) for name, prio in _PARTS.values()]
    cols.append(Column("peak at", priority=3, wrap=True, min_width=16))
    if any(e.budget_bytes is not None for e in estimates) or any(e.note for e in estimates):
        cols.append(Column("fits budget", priority=3 if _verdicts(estimates) else 1, wrap=True, min_width=10))
    return cols


def size_unit(estimates: Sequence[Estimate], measured: Measured | None = None) -> SizeUnit:
    """One unit for every size of the output (units.py)."""
    seen = [v for v in (measured or {}).values() if isinstance(v, int)]
    return SizeUnit.for_sizes([*(e.peak_bytes for e in estimates), *map(_predicted_reserved, estimates), *seen])


def estimate_rows(
    estimates: Sequence[Estimate], measured: Measured | None = None, reserved: Reserved | None = None,
    times: Times | None = None,
) -> list[dict[str, str]]:
    """One display row per point: strings ready for any renderer."""
    axes, size = _axes(estimates), size_unit(estimates, measured)
    measured, reserved = measured or {}, reserved or {}
    rows = []
    for e in estimates:
        key = e.point.key
        row = {"layout": str(key["layout"]), "batch": str(key["batch_size"]), "seq": str(key["seq_len"])}
        row["precision"], row["setup"] = str(key["precision"]), _setup(key, axes)
        row["est. peak"] = size(e.peak_bytes)
        seen = measured.get(e.point.key_id, "-")
        row["measured"] = size(seen) if isinstance(seen, int) else seen
        row["error"] = fmt_percent(_error(e, measured), signed=True)
        row.update(_reserved_cells(e, reserved, size))
        row.update(time_cells((times or {}).get(e.point.key_id)))
        row.update({name: size(e.breakdown.get(part)) for part, (name, _) in _PARTS.items()})
        row["peak at"] = e.peak_at or "-"
        row["fits budget"] = _fit(e, size)
        rows.append(row)
    return rows


def _title(estimates: Sequence[Estimate], name: str, *, with_measured: bool = False) -> str:
    target = estimates[0].target if estimates else "cuda"
    budget = next((e.budget_bytes for e in estimates if e.budget_bytes is not None), None)
    within = f", budget {size_unit(estimates)(budget)}" if budget is not None else ""
    card = next((e.reserved for e in estimates if e.reserved is not None), None)
    if card is None:
        what = f"predicted peak allocated memory on {target}"
    else:
        status = "measured figures" if card.gpu_measured else "card figures estimated"
        what = f"predicted peak allocated and reserved memory on {card.gpu} ({status})"
    # Which columns are which: a run's measurements sit beside the predictions under their own names.
    label = "'measured' columns measured by the run, every other number predicted" if with_measured else (
        "every number predicted")
    return f"ckptbench estimate: {name} ({what}{within}; {label})"


def estimate_table(
    estimates: Sequence[Estimate], *, name: str, measured: Measured | None = None, reserved: Reserved | None = None,
    times: Times | None = None,
) -> FitTable:
    """A table of estimates (and measurements, from a run) that fits the terminal; misfits are yellow."""
    return FitTable(
        estimate_rows(estimates, measured, reserved, times),
        estimate_columns(estimates, measured, reserved, times),
        title=_title(estimates, name, with_measured=bool(measured or reserved)),
        caption=_caption(estimates) + (_times_caption(times) if times is not None else ""),
        styles=["yellow" if e.fits is False else None for e in estimates],
        complete_hint="--format markdown shows every column",
    )


def _times_caption(times: Times) -> str:
    """Where the step times come from: each distinct source once."""
    sources = list(dict.fromkeys(p.source for p in times.values() if p is not None))
    listed = "; ".join(sources) if sources else "no measured point determines these points"
    return f"\nstep (predicted): step-time model, not a measurement: {listed}"


def _caption(estimates: Sequence[Estimate]) -> str:
    text = "breakdown at the predicted peak; fake-tensor trace of the training step, not a measurement"
    if any(e.reserved_bound_bytes is not None for e in estimates):
        text += ("; reserved bound: est. reserved raised by the worst under-prediction seen on the committed H200 runs "
                 "for its kind of layout (docs/estimating.md), what 'fits budget' is decided on")
    return text


def estimate_markdown(
    estimates: Sequence[Estimate], *, name: str = "", measured: Measured | None = None,
    reserved: Reserved | None = None, times: Times | None = None,
) -> str:
    """A Markdown section: title line, then the table."""
    body = markdown_of(estimate_rows(estimates, measured, reserved, times),
                       estimate_columns(estimates, measured, reserved, times))
    note = f"\n{_times_caption(times).strip()}\n" if times is not None else ""
    return f"**{_title(estimates, name, with_measured=bool(measured or reserved))}**\n\n{body}{note}"


def _records(
    estimates: Sequence[Estimate], measured: Measured | None, reserved: Reserved | None = None,
    times: Times | None = None,
) -> list[dict[str, Any]]:
    out = []
    for e in estimates:
        rec = e.to_record()
        if times is not None:
            prediction = times.get(e.point.key_id)
            rec.update(prediction.to_json() if prediction is not None else NO_TIME)
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
    estimates: Sequence[Estimate], *, name: str = "", measured: Measured | None = None,
    reserved: Reserved | None = None, times: Times | None = None,
) -> str:
    """A JSON list: one object per point with ``key``, the predicted peaks (allocated, reserved), the breakdown
    (with ``times``, the fitted step time and its source)."""
    return json.dumps(_records(estimates, measured, reserved, times), sort_keys=True, indent=2) + "\n"


_RESERVED_KEYS = (
    "predicted_peak_reserved_bytes", "predicted_fragmentation_bytes", "predicted_num_alloc_retries", "gpu",
)


def estimate_csv(
    estimates: Sequence[Estimate], *, name: str = "", measured: Measured | None = None,
    reserved: Reserved | None = None, times: Times | None = None,
) -> str:
    """One flat row per point, raw bytes: ``predicted_at_peak_*`` is the breakdown at the peak,
    ``predicted_{params,grads,optimizer_state}_bytes`` the whole model's static memory."""
    rows: list[dict[str, Any]] = []
    for e, rec in zip(estimates, _records(estimates, measured, reserved, times), strict=True):
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
        row.update({k: rec[k] for k in NO_TIME if k in rec})
        rows.append(row)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return csv_text(rows, columns)


RENDERERS = {"markdown": estimate_markdown, "csv": estimate_csv, "json": estimate_json}
