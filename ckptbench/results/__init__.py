"""Results: the on-disk schema of a run (run.json, points.jsonl), the point record and its derived
statistics, loading and appending, and the DataFrame view. Must not import torch nor print."""

from ckptbench.results.frame import to_frame
from ckptbench.results.store import Run, load_run

__all__ = ["Run", "load_run", "to_frame"]
