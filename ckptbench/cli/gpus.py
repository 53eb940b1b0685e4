"""`ckptbench gpus`: the cards --gpu takes, with every figure's source."""

from __future__ import annotations

import sys

from ckptbench.cli.common import Format, FormatOpt, out


def gpus_cmd(fmt: FormatOpt = Format.table) -> None:
    """The cards advise and estimate know: memory, CUDA context, dense bf16 peak, memory bandwidth, each figure with
    its source. --gpu also takes a memory size (24GiB) for a card not listed."""
    from ckptbench.render.gpus import gpus_csv, gpus_json, gpus_markdown, gpus_table

    if fmt is Format.table:
        out.print(gpus_table())
    else:
        sys.stdout.write({Format.markdown: gpus_markdown, Format.csv: gpus_csv, Format.json: gpus_json}[fmt]())
