"""The ``parallel`` axis: how a point's training step is spread over ranks. Pure data, no torch.

Grammar::

    PARALLEL := "none"                 one process, one device (every point before this axis existed)
              | "ddp:" N               DistributedDataParallel over N ranks: every rank holds the whole
                                       model, gradients are all-reduced in buckets
              | "fsdp2:" N [":noreshard"]
                                       PyTorch's fully_shard (FSDP2) per decoder layer and on the root
                                       over N ranks: parameters, gradients and optimizer state sharded;
                                       a layer's parameters are all-gathered for its forward and freed
                                       after it (``reshard_after_forward``), or, with ``:noreshard``,
                                       kept until its backward (more memory, no second all-gather)

``batch_size`` stays per rank: a ``ddp:8`` point at batch 4 trains on 32 sequences per step. Which techniques a
sharded point combines with: config/compat.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_WORLD_SIZE = 4096
PARALLEL_PATTERN = r"^(none|ddp:[1-9][0-9]*|fsdp2:[1-9][0-9]*(:noreshard)?)$"
PARALLEL_SYNTAX = "none | ddp:N | fsdp2:N | fsdp2:N:noreshard"


@dataclass(frozen=True)
class ParallelSpec:
    """One value of the parallel axis, parsed."""

    kind: str  # 'none', 'ddp' or 'fsdp2'
    world_size: int = 1
    reshard_after_forward: bool = True

    @property
    def distributed(self) -> bool:
        """Whether the point runs as ranks of a process group (even a world of one)."""
        return self.kind != "none"


def parse_parallel(text: str) -> ParallelSpec:
    """'fsdp2:8:noreshard' -> ParallelSpec('fsdp2', 8, False); ValueError for anything else."""
    if not re.fullmatch(PARALLEL_PATTERN, str(text)):
        raise ValueError(f"parallel entries are {PARALLEL_SYNTAX}, got {text!r}")
    if text == "none":
        return ParallelSpec("none")
    kind, world, *rest = text.split(":")
    if int(world) > MAX_WORLD_SIZE:
        raise ValueError(f"parallel {text!r}: at most {MAX_WORLD_SIZE} ranks")
    return ParallelSpec(kind, int(world), reshard_after_forward=not rest)


def world_size(text: str) -> int:
    """The number of ranks (devices) a parallel value needs: 1 for 'none'."""
    return parse_parallel(text).world_size
