"""What each layout of a config checkpoints, as display rows (``ckptbench layouts``)."""

from __future__ import annotations

from ckptbench.config.layouts import LayoutPlan, parse_layout
from ckptbench.config.schema import SweepConfig
from ckptbench.render.tables import Column, FitTable

# The layout's name and its layers matter most; the module paths only repeat them in long form.
LAYOUT_COLUMNS = (
    Column("layout"),
    Column("layers (0-based)", wrap=True, min_width=12),
    Column("count", priority=1, numeric=True),
    Column("wraps", priority=2, wrap=True, min_width=13),
    Column("modules", priority=3, wrap=True, min_width=24),
)


def _modules_text(targets: tuple[str, ...]) -> str:
    if not targets:
        return "-"
    shown = [f"model.layers.{t}" for t in targets[:3]]
    more = f" (+{len(targets) - 3} more)" if len(targets) > 3 else ""
    return ", ".join(shown) + more


def _wraps(plan: LayoutPlan) -> str:
    """What is wrapped in each chosen layer: the whole layer, per-op inside it, or named sub-modules."""
    if not plan.layers:
        return "-"
    whole = {"block": "decoder layer", "selective": "decoder layer, per-op (selective)"}
    return whole.get(plan.granularity) or ", ".join(plan.submodules)


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
        rows.append(
            {
                "layout": name,
                "layers (0-based)": plan.describe_layers(),
                "count": f"{len(plan.layers)}/{n}",
                "wraps": _wraps(plan),
                "modules": _modules_text(plan.targets),
            }
        )
    return rows


def layouts_table(cfg: SweepConfig) -> FitTable:
    """The table of ``layout_rows``, fitted to the terminal."""
    title = f"{cfg.model.name}: {cfg.model.num_layers} decoder layers"
    return FitTable(layout_rows(cfg), LAYOUT_COLUMNS, title=title)
