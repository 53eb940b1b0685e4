"""The summary of a run: display rows, the rich table, summary.md/summary.csv, the searches' answers."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from ckptbench.config.grid import setup_label
from ckptbench.render.tables import markdown_table, rich_table
from ckptbench.results.frame import to_frame
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run, write_text_atomic

GIB = 2**30
MIB = 2**20

COLUMNS: tuple[str, ...] = (
    "layout",
    "batch",
    "seq",
    "precision",
    "ckpt layers",
    "peak",
    "reserved",
    "activation",
    "step ms",
    "± ms",
    "tok/s",
    "MFU",
    "status",
)


def _num(value: float | None, fmt: str, scale: float = 1.0) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return format(value / scale, fmt)


def _percent(value: float | None) -> str:
    text = _num(value * 100 if value is not None else None, ".1f")
    return text if text == "-" else f"{text}%"


def _mem(value: float | None, scale: int, unit: str) -> str:
    text = _num(value, ".2f", scale)
    return text if text == "-" else f"{text} {unit}"


def summary_columns(run: Run) -> tuple[str, ...]:
    """COLUMNS, plus 'setup' when a technique axis varies and 'predicted'/'pred. err' when estimated."""
    cols = list(COLUMNS)
    if any(setup_label(p.key) for p in run.points):
        cols.insert(cols.index("precision") + 1, "setup")
    if any(p.predicted_peak_allocated_bytes for p in run.points):
        at = cols.index("peak") + 1
        cols[at:at] = ["predicted", "pred. err"]
    if any(p.predicted_peak_reserved_bytes or p.predicted_oom for p in run.points):
        at = cols.index("reserved") + 1
        cols[at:at] = ["pred. reserved", "res. err"]
    return tuple(cols)


def _reserved_prediction(rec: PointRecord, scale: int, unit: str) -> tuple[str, str]:
    pred, meas = rec.predicted_peak_reserved_bytes, rec.peak_reserved_bytes
    if rec.predicted_oom:
        return "OOM (est.)", "-"
    if pred is None:
        return "-", "-"
    err = "-" if not rec.ok or not meas else f"{(pred - meas) / meas * 100:+.2f}%"
    return _mem(pred, scale, unit) + " (est.)", err


def _prediction(rec: PointRecord, scale: int, unit: str) -> tuple[str, str]:
    pred, meas = rec.predicted_peak_allocated_bytes, rec.peak_allocated_bytes
    if pred is None:
        return "-", "-"
    err = "-" if not rec.ok or not meas else f"{(pred - meas) / meas * 100:+.2f}%"
    return _mem(pred, scale, unit) + " (est.)", err


def _status(rec: PointRecord) -> str:
    if rec.ok and rec.leaked:
        return "ok (leak)"
    if rec.ok and rec.loss_mismatch:
        return "ok (loss mismatch)"
    if rec.ok and (rec.loss_check is None or rec.loss_check.match is None):
        return "ok (loss unchecked)"  # older runs left a point unchecked when 'none' did not run
    return rec.status if rec.ok or not rec.reason else f"{rec.status}: {rec.reason}"


def summary_rows(run: Run) -> list[dict[str, str]]:
    """One display row per point, in run order: strings ready for any renderer."""
    peaks = [p.peak_allocated_bytes for p in run.points if p.peak_allocated_bytes is not None]
    # GiB for real models; tiny CPU models are shown in MiB so that differences stay visible.
    scale, unit = (GIB, "GiB") if not peaks or max(peaks) >= GIB else (MIB, "MiB")
    rows: list[dict[str, str]] = []
    for rec in run.points:
        ok, key = rec.ok, rec.key
        predicted, pred_err = _prediction(rec, scale, unit)
        reserved, res_err = _reserved_prediction(rec, scale, unit)
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
                "peak": _mem(rec.peak_allocated_bytes if ok else None, scale, unit),
                "reserved": _mem(rec.peak_reserved_bytes if ok else None, scale, unit),
                "activation": _mem(rec.activation_bytes if ok else None, scale, unit),
                "step ms": _num(rec.median_step_time_s, ".1f", 1e-3),
                "± ms": _num(rec.step_time_iqr_s, ".1f", 1e-3),
                "tok/s": _num(rec.tokens_per_s, ",.0f"),
                "MFU": _percent(rec.mfu),
                "status": _status(rec),
            }
        )
    return rows


def summary_table(run: Run) -> Table:
    """The final table of a sweep."""
    return rich_table(summary_rows(run), summary_columns(run), title=f"ckptbench: {run.name}")


def run_header(run: Run) -> str:
    """One line naming the machine and software a run was measured on."""
    env = run.environment
    where = env.get("gpu_name") or f"CPU ({env.get('probe', 'live-tensor tracker')})"
    return (
        f"{run.name}: {where}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
        f"status {run.meta.get('status', '?')}"
    )


def write_summaries(run: Run) -> tuple[Path, Path]:
    """Write summary.csv (raw numbers, one row per point) and summary.md (the display table)."""
    frame = to_frame(run)
    csv_path, md_path = run.path / "summary.csv", run.path / "summary.md"
    write_text_atomic(csv_path, frame.to_csv(index=False))
    note = ""
    if run.environment.get("device_type") == "cpu":
        note = (
            "\nMemory on CPU is measured by ckptbench's live-tensor tracker (reserved = allocated); "
            "CPU step times include the tracker's overhead.\n"
        )
    text = f"# {run.name}\n\n{run_header(run)}\n\n" + markdown_table(summary_rows(run), summary_columns(run)) + note
    write_text_atomic(md_path, text)
    return csv_path, md_path


def search_rows(run: Run) -> list[dict[str, str]]:
    """One row per search of a run (batch_size: max, layout: fit) with its measured answer."""
    rows = []
    for s in run.meta.get("searches") or []:
        answer = s.get("answer") or {}
        if s.get("kind") == "batch_max":
            text = "nothing fits" if answer.get("batch_size") is None else f"batch {answer['batch_size']}"
            if answer.get("first_failing_batch_size"):
                text += f" (batch {answer['first_failing_batch_size']} does not fit)"
        else:
            k = answer.get("num_checkpointed")
            text = "nothing fits, even 'all'" if k is None else f"{answer['layout']} ({k} layers)"
        probes = ", ".join(str(p) for p in s.get("probes", []))
        rows.append({"search": str(s.get("kind")), "cell": str(s.get("group")), "answer": text, "probes": probes})
    return rows


def search_table(run: Run) -> Table:
    """The answers of a run's searches, each resting on the measured probes it lists."""
    return rich_table(search_rows(run), ["search", "cell", "answer", "probes"], title="searches (measured)")
