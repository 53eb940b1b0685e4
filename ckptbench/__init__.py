"""ckptbench: measure what activation checkpointing costs and saves on LLaMA-class training."""

__version__ = "0.1.0"
