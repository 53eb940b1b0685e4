"""Rendering: rich tables, Markdown and CSV of a run's summary (no metrics computed here)."""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Sequence
from pathlib import Path

from rich.table import Table

from ckptbench.results import Run, to_frame, write_text_atomic
from ckptbench.summary import summary_columns, summary_rows

_RIGHT = {"batch", "seq", "peak", "predicted", "pred. err", "reserved", "activation", "step ms", "± ms", "tok/s",
          "MFU", "count"}


def rich_table(rows: Sequence[dict[str, str]], columns: Sequence[str], *, title: str | None = None) -> Table:
    """A rich table of string rows."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        table.add_column(col, justify="right" if col in _RIGHT else "left", no_wrap=col != "status")
    for row in rows:
        style = None if row.get("status", "ok").startswith("ok") else "yellow"
        table.add_row(*(row[c] for c in columns), style=style)
    return table


def markdown_table(
    rows: Sequence[dict[str, str]], columns: Sequence[str], *, right: Collection[str] = _RIGHT
) -> str:
    """A GitHub-flavoured Markdown table of string rows; ``right`` names the right-aligned columns."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |"]
    lines.append("| " + " | ".join("---:" if c in right else "---" for c in columns) + " |")
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_text(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


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
