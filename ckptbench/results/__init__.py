"""Results: the on-disk schema of a run (run.json, points.jsonl), the point record and its derived
statistics, loading and appending, and the DataFrame view. Must not import torch nor print."""
