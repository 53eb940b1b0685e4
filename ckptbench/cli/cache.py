"""`ckptbench cache`: where the trace cache lives and what it holds (`info`), or empty it (`clear`)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer
from rich.markup import escape

from ckptbench.cli.common import out


class CacheAction(str, Enum):
    """What `ckptbench cache` does."""

    info = "info"
    clear = "clear"


def cache_cmd(
    action: Annotated[CacheAction, typer.Argument(help="info: where the cache is and what it holds; clear: empty it.")
                      ] = CacheAction.info,
) -> None:
    """The traces advise, estimate and answers keep on disk between commands (each training step traced on fake
    tensors once per model, precision, optimizer, techniques and shapes; asking again for another card replays
    them), and the estimates replayed from them (asking again for the same card, another budget or headroom, or a
    subset of the batches reads them). Kept under $CKPTBENCH_CACHE_DIR, else $XDG_CACHE_HOME/ckptbench, else
    ~/.cache/ckptbench; bounded by $CKPTBENCH_CACHE_MAX_BYTES (default 2 GiB); CKPTBENCH_CACHE_DIR=off turns it off.
    A trace made by another ckptbench, torch or transformers is never used."""
    from ckptbench.estimator.trace_cache import ENV_DIR, default_cache
    from ckptbench.units import fmt_bytes

    cache = default_cache()
    if cache is None:
        out.print(f"the trace cache is off ({ENV_DIR} is set to turn it off): nothing kept, nothing to clear")
        return
    where = escape(str(cache.root))
    if action is CacheAction.clear:
        gone = cache.clear()
        out.print(f"removed {gone.entries} entr{'ies' if gone.entries != 1 else 'y'} ({fmt_bytes(gone.bytes)}) from "
                  f"{where}")
        return
    size = cache.size()
    out.print(f"trace cache: {where}\n"
              f"  {size.entries} entr{'ies' if size.entries != 1 else 'y'} (traces and the estimates replayed from "
              f"them), {fmt_bytes(size.bytes)} "
              f"(this version of ckptbench, torch and transformers: {size.current_entries}, "
              f"{fmt_bytes(size.current_bytes)})\n"
              f"  bound: {fmt_bytes(cache.limit)} (the least recently used go first, other versions' before them)")
