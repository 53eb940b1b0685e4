"""The summary of a run: display rows, the rich table, summary.md/summary.csv, the searches' answers."""

from __future__ import annotations

from pathlib import Path

from ckptbench.config.grid import setup_label
from ckptbench.render.tables import Column, FitTable, markdown_of, status_style
from ckptbench.results.frame import to_frame
from ckptbench.results.meta import SearchAnswer, TimingEntry
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run, write_text_atomic
from ckptbench.units import SizeUnit, fmt_bytes, fmt_percent, tried_allocation_bytes

# In display order; a narrow terminal leaves out the highest priority numbers first. Narrower still (40 columns),
# the status and the step time go too (keep): each point and its peak stay.
COLUMNS: tuple[Column, ...] = (
    Column("layout"),
    Column("batch", numeric=True, keep=1),
    Column("seq", numeric=True, keep=1),
    Column("precision", priority=5),
    Column("ckpt layers", priority=6, wrap=True, min_width=10),
    Column("peak", numeric=True),
    Column("reserved", priority=2, numeric=True),
    Column("activation", priority=3, numeric=True),
    Column("step ms", numeric=True, keep=2),
    Column("± ms", priority=4, numeric=True),
    Column("tok/s", priority=1, numeric=True),  # what the sweep is run for: the last to give way
    Column("MFU", priority=2, numeric=True),
    Column("HFU", priority=4, numeric=True),
    # A long status ('skipped: batch 16 already ran out of memory') wraps before tok/s gives way.
    Column("status", wrap=True, min_width=13, gives_way=True, keep=3),
)
_SETUP = Column("setup", wrap=True, min_width=10, breaks="=_", fold=True, keep=3)
# With a setup column the layout folds too ('every:2@' over 'selective'), so that no number is cut at 80 columns.
_FOLDED_LAYOUT = Column("layout", wrap=True, min_width=9, breaks="@", fold=True)
_PREDICTED = (Column("predicted", priority=4, numeric=True), Column("pred. err", priority=4, numeric=True))
_PREDICTED_RESERVED = (
    Column("pred. reserved", priority=4, numeric=True), Column("res. err", priority=4, numeric=True),
)
_REASON_CHARS = 100  # an error's reason in a table cell; points.jsonl keeps all of it


def _num(value: float | None, fmt: str, scale: float = 1.0) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return format(value / scale, fmt)


def summary_columns(run: Run) -> tuple[Column, ...]:
    """COLUMNS, plus 'setup' when a technique axis varies and 'predicted'/'pred. err' (allocated) and
    'pred. reserved'/'res. err' when estimated; precision is as essential as the layout when it varies."""
    cols: list[Column] = []
    varies = len({p.key.get("precision") for p in run.points}) > 1
    setup = any(setup_label(p.key) for p in run.points)
    # On a CPU reserved is allocated (the live-tensor tracker): the column repeats 'peak' and gives way first.
    same = all(p.peak_reserved_bytes == p.peak_allocated_bytes for p in run.points)
    for col in COLUMNS:
        if col.name == "reserved" and same:
            col = Column("reserved", priority=7, numeric=True)
        if col.name == "layout" and setup:
            col = _FOLDED_LAYOUT
        cols.append(Column("precision") if col.name == "precision" and varies else col)
        if col.name == "precision" and setup:
            cols.append(_SETUP)
        if col.name == "peak" and any(p.predicted_peak_allocated_bytes for p in run.points):
            cols += _PREDICTED
        if col.name == "reserved" and any(p.predicted_peak_reserved_bytes or p.predicted_oom for p in run.points):
            cols += _PREDICTED_RESERVED
    return tuple(cols)


def size_unit(run: Run) -> SizeUnit:
    """The one unit of every size shown for this run (units.py: GiB unless all are below 1 GiB)."""
    return SizeUnit.for_sizes(run.sizes())


def _prediction(rec: PointRecord, size: SizeUnit) -> tuple[str, str]:
    pred, meas = rec.predicted_peak_allocated_bytes, rec.peak_allocated_bytes
    if pred is None:
        return "-", "-"
    err = None if not rec.ok or not meas else (pred - meas) / meas
    return size(pred) + " (est.)", fmt_percent(err, signed=True)


def _reserved_prediction(rec: PointRecord, size: SizeUnit) -> tuple[str, str]:
    """The reserved prediction made before the run (or its predicted out-of-memory error), with its error."""
    pred, meas = rec.predicted_peak_reserved_bytes, rec.peak_reserved_bytes
    if rec.predicted_oom:
        return "OOM (est.)", "-"
    if pred is None:
        return "-", "-"
    err = None if not rec.ok or not meas else (pred - meas) / meas
    return size(pred) + " (est.)", fmt_percent(err, signed=True)


def status_text(rec: PointRecord) -> str:
    """'ok', 'ok (leak)', 'oom (tried 1.95 GiB)', 'error: <reason>' (the full message stays in points.jsonl);
    timing warnings (a busy machine, unsteady steps: measure/environment.py) are added to an ok point's."""
    text = _status_text(rec)
    if rec.ok and rec.warnings:
        kinds = ", ".join(rec.warning_kinds)
        text = f"{text[:-1]}; {kinds})" if text.endswith(")") else f"{text} ({kinds})"
    return text


def _status_text(rec: PointRecord) -> str:
    if rec.ok and rec.leaked:
        return "ok (leak)"
    if rec.ok and rec.loss_mismatch:
        return "ok (loss mismatch)"
    if rec.ok and (rec.loss_check is None or rec.loss_check.match is None):
        return "ok (loss unchecked)"  # older runs left a point unchecked when 'none' did not run
    if rec.ok or not rec.reason:
        return rec.status
    if rec.status == "oom":
        tried = tried_allocation_bytes(rec.reason)
        return "oom" if tried is None else f"oom (tried {fmt_bytes(tried)})"
    reason = rec.reason.splitlines()[0]
    if len(reason) > _REASON_CHARS:
        reason = reason[: _REASON_CHARS - 1].rstrip() + "…"
    return f"{rec.status}: {reason}"


def summary_rows(run: Run, *, size: SizeUnit | None = None) -> list[dict[str, str]]:
    """One display row per point, in run order: strings ready for any renderer (sizes in ``size``,
    by default the run's unit)."""
    size = size or size_unit(run)
    rows: list[dict[str, str]] = []
    for rec in run.points:
        ok, key = rec.ok, rec.key
        predicted, pred_err = _prediction(rec, size)
        reserved, res_err = _reserved_prediction(rec, size)
        rows.append(
            {
                "pred. reserved": reserved,
                "res. err": res_err,
                "setup": setup_label(key) or "-",
                "predicted": predicted,
                "pred. err": pred_err,
                "layout": str(key.get("layout")),
                "batch": str(key.get("batch_size")),
                "seq": str(key.get("seq_len")),
                "precision": str(key.get("precision")),
                "ckpt layers": str(rec.layers_checkpointed or "-"),
                "peak": size(rec.peak_allocated_bytes if ok else None),
                "reserved": size(rec.peak_reserved_bytes if ok else None),
                "activation": size(rec.activation_bytes if ok else None),
                "step ms": _num(rec.median_step_time_s, ".1f", 1e-3),
                "± ms": _num(rec.step_time_iqr_s, ".1f", 1e-3),
                "tok/s": _num(rec.tokens_per_s, ",.0f"),
                "MFU": fmt_percent(rec.mfu, digits=1),
                "HFU": fmt_percent(rec.hfu, digits=1),
                "status": status_text(rec),
            }
        )
    return rows


def summary_table(run: Run) -> FitTable:
    """The final table of a sweep, fitted to the terminal (summary.md has every column)."""
    rows = summary_rows(run)
    return FitTable(rows, summary_columns(run), title=f"ckptbench: {run.title}",
                    styles=[status_style(r["status"]) for r in rows],
                    complete_hint="summary.md in the run directory has every column")


def run_header(run: Run) -> str:
    """One line naming the machine and software a run was measured on."""
    env = run.environment
    where = env.gpu_name or f"CPU ({env.probe or 'live-tensor tracker'})"
    line = (
        f"{run.title}: {where}, torch {env.torch}, transformers {env.transformers}, "
        f"status {run.meta.status or '?'}"
    )
    mixed = run.mixed_gpus
    return f"{line}; points ran on different GPU models: {mixed}" if mixed else line


def summary_markdown(run: Run, *, size: SizeUnit | None = None) -> str:
    """The complete summary table as Markdown."""
    return markdown_of(summary_rows(run, size=size), summary_columns(run))


def write_summaries(run: Run) -> tuple[Path, Path]:
    """Write summary.csv (raw numbers, one row per point) and summary.md (the display table)."""
    frame = to_frame(run)
    csv_path, md_path = run.path / "summary.csv", run.path / "summary.md"
    write_text_atomic(csv_path, frame.to_csv(index=False))
    note = ""
    if run.environment.device_type == "cpu":
        note = (
            "\nMemory on CPU is measured by ckptbench's live-tensor tracker (reserved = allocated); "
            "CPU step times include the tracker's overhead.\n"
        )
    text = f"# {run.title}\n\n{run_header(run)}\n\n" + summary_markdown(run) + note
    write_text_atomic(md_path, text)
    return csv_path, md_path


SEARCH_COLUMNS = (Column("search"), Column("cell", wrap=True), Column("answer", wrap=True),
                  Column("probes", priority=1, wrap=True, min_width=20))


def search_rows(run: Run) -> list[dict[str, str]]:
    """One row per search of a run (batch_size: max, layout: fit) with its measured answer."""
    rows = []
    for s in run.meta.searches:
        if s.kind == "tune":
            continue  # `ckptbench tune` prints (and `report` shows) its own search: render/tune.py
        answer = s.answer or SearchAnswer()
        if s.kind == "batch_max":
            text = "nothing fits" if answer.batch_size is None else f"batch {answer.batch_size}"
            if answer.first_failing_batch_size:
                text += f" (batch {answer.first_failing_batch_size} does not fit)"
        else:
            k = answer.num_checkpointed
            text = "nothing fits, even 'all'" if k is None else f"{answer.layout} ({k} layers)"
        probes = ", ".join(str(p) for p in s.probes)
        rows.append({"search": str(s.kind), "cell": str(s.group), "answer": text, "probes": probes})
    return rows


def search_table(run: Run) -> FitTable:
    """The answers of a run's searches, each resting on the measured probes it lists."""
    return FitTable(search_rows(run), SEARCH_COLUMNS, title="searches (measured)")


def timing_line(entry: TimingEntry) -> str:
    """Where one sweep command's wall time went (run.json timing, sweep/timing.py), in one line."""
    parts = [
        ("start-up", entry.startup_s), ("environment", entry.environment_s), ("predictions", entry.predictions_s),
        ("waiting for predictions", entry.predictions_wait_s), ("steps", entry.steps_s),
        ("per-point overhead", entry.point_overhead_s), ("between points", entry.between_points_s),
        ("finish", entry.finish_s),
    ]
    shown = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in parts if seconds is not None)
    wall, steps = entry.command_wall_s, entry.steps_s
    ratio = f" ({wall / steps:.2f}x the steps)" if wall and steps else ""
    return f"time: {wall or 0:.1f} s in all{ratio}: {shown}"
