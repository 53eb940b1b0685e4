"""What the installed transformers offers to turn checkpointing on, read from its signatures: asked by the training
code (train/checkpointing.py) and by advise's snippets, which keep the answer in the trace cache (it depends on the
transformers version only), so that advise need not import transformers to say it."""

from __future__ import annotations


def transformers_switches() -> tuple[bool, bool]:
    """What the installed transformers offers to turn checkpointing on: (``activation_checkpointing_enable``,
    which deprecates ``gradient_checkpointing_enable``; its ``every_n_layers``, which HF Trainer's
    gradient_checkpointing_kwargs passes on), read from its signature."""
    import inspect

    from transformers import PreTrainedModel

    enable = getattr(PreTrainedModel, "activation_checkpointing_enable", None)
    return enable is not None, enable is not None and "every_n_layers" in inspect.signature(enable).parameters
