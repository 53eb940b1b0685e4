"""What each layout of a config checkpoints, as display rows (``ckptbench layouts``)."""

from __future__ import annotations

from rich.table import Table

from ckptbench.config.layouts import parse_layout
from ckptbench.config.schema import SweepConfig
from ckptbench.render.tables import rich_table

LAYOUT_COLUMNS = ("layout", "layers (0-based)", "count", "wraps", "modules")


def _modules_text(targets: tuple[str, ...]) -> str:
    if not targets:
        return "-"
    shown = [f"model.layers.{t}" for t in targets[:3]]
    more = f" (+{len(targets) - 3} more)" if len(targets) > 3 else ""
    return ", ".join(shown) + more


def layout_rows(cfg: SweepConfig) -> list[dict[str, str]]:
    """One row per layout named in the config (sweep axis, then explicit points), in order."""
    n = cfg.model.num_layers
    names = list(dict.fromkeys([*cfg.sweep.layout, *(p.layout for p in cfg.points if p.layout)]))
    rows = []
    for name in names:
        if name == "fit":
            rows.append({"layout": name, "layers (0-based)": "searched", "count": "-", "wraps": "decoder layer",
                         "modules": "first:k, k found by measurement (layout: fit)"})
            continue
        plan = parse_layout(name, n)
        wraps = "decoder layer" if plan.granularity == "block" else ", ".join(plan.submodules)
        rows.append(
            {
                "layout": name,
                "layers (0-based)": plan.describe_layers(),
                "count": f"{len(plan.layers)}/{n}",
                "wraps": wraps if plan.layers else "-",
                "modules": _modules_text(plan.targets),
            }
        )
    return rows


def layouts_table(cfg: SweepConfig) -> Table:
    """The rich table of ``layout_rows``."""
    title = f"{cfg.model.name}: {cfg.model.num_layers} decoder layers"
    return rich_table(layout_rows(cfg), LAYOUT_COLUMNS, title=title)
