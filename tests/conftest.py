"""Shared fixtures: tiny configs built through the same code path as LLaMA-7B."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ckptbench.config import SweepConfig, parse_config


def tiny_config(**overrides: Any) -> SweepConfig:
    """A CPU config of the tiny preset; keyword arguments replace top-level fields."""
    data: dict[str, Any] = {
        "name": "t",
        "device": "cpu",
        "model": {"preset": "tiny"},
        "warmup_steps": 1,
        "measured_steps": 2,
        "sweep": {"layout": ["none"], "batch_size": [2], "seq_len": [128], "precision": ["fp32"]},
    }
    data.update(overrides)
    return parse_config(data)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
