"""ckptbench: measure what activation checkpointing costs and saves on LLaMA-class training.

The Python API (ckptbench/api.py; README "Use from Python") is importable from here; importing the
package stays light: torch and the rest of the core are imported when a function is first called.
"""

from ckptbench.api import (
    SweepOptions,
    apply,
    compare_runs,
    estimate,
    load_config,
    load_run,
    plan,
    recommend,
    run_sweep,
)

__version__ = "0.1.0"

__all__ = [
    "SweepOptions", "__version__", "apply", "compare_runs", "estimate", "load_config", "load_run", "plan", "recommend",
    "run_sweep",
]
