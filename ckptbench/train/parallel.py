"""Sharding wrappers for the ``parallel`` axis: DistributedDataParallel, or FSDP2's ``fully_shard`` per
decoder layer and on the root, set up on one rank of a process group.

The process group is ``env://``: the launcher (processes/launch.py, or torchrun) sets ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; NCCL on GPUs, gloo on CPU. The
estimator runs the same wrappers on fake tensors over PyTorch's fake process group.

Checkpointing (train/checkpointing.py) replaces the chosen modules' ``forward`` after sharding: FSDP's
hooks run in ``Module.__call__``, outside the checkpointed ``forward``, so a layer's parameters are
all-gathered before its forward and again before its backward, where the recomputation runs: the
nesting torchtitan gets by wrapping blocks for checkpointing before ``fully_shard``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ckptbench.config.parallel import ParallelSpec, parse_parallel
from ckptbench.train.model import decoder_layers
from ckptbench.train.step import amp_dtype

# How long a rank waits in a collective for the others: a rank that died must not hang the rest for
# NCCL's default of 10 minutes (the launcher also kills the survivors soon after one rank exits).
COLLECTIVE_TIMEOUT = dt.timedelta(minutes=5)

GradSync = Callable[[bool], contextlib.AbstractContextManager[Any]]


@dataclass(frozen=True)
class RankInfo:
    """Which rank of which world this process is (from the launcher's environment variables)."""

    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def from_env(cls) -> RankInfo | None:
        """This process's rank, or None when it was not launched as one."""
        if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
            return None
        rank = int(os.environ["RANK"])
        return cls(rank, int(os.environ.get("LOCAL_RANK", rank)), int(os.environ["WORLD_SIZE"]))


def init_process_group(rank: RankInfo, device: torch.device) -> None:
    """Join the env:// process group: NCCL for a GPU, gloo for the CPU."""
    if device.type == "cuda":
        dist.init_process_group("nccl", timeout=COLLECTIVE_TIMEOUT, device_id=device)
    else:
        dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)


@dataclass
class Sharded:
    """A model set up for one parallel setting: what the trainer calls, and how micro-batches sync."""

    spec: ParallelSpec
    forward: nn.Module  # the module whose forward runs the step: the DDP wrapper, or the model itself
    # False when FSDP2's mixed-precision policy casts the parameters instead of autocast (amp precisions).
    autocast: bool = True

    def reshard(self) -> None:
        """Free the unsharded parameters a forward without backward left (fsdp2:N:noreshard keeps them
        after the forward, and only a backward reshards them): the next forward all-gathers the
        current weights instead of training on stale ones."""
        if self.spec.kind != "fsdp2":
            return
        from torch.distributed.fsdp import FSDPModule

        for module in self.forward.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def grad_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Around one micro-batch's forward and backward: gradients are reduced only on the last one."""
        if self.spec.kind == "ddp" and not last:
            no_sync: contextlib.AbstractContextManager[Any] = self.forward.no_sync()  # type: ignore[operator]
            return no_sync
        if self.spec.kind == "fsdp2":
            self.forward.set_requires_gradient_sync(last)  # type: ignore[operator]
        return contextlib.nullcontext()


def shard(model: nn.Module, parallel: str, *, precision: str, device: torch.device, mesh: Any = None) -> Sharded:
    """Wrap ``model`` for ``parallel`` on this rank ('none' leaves it as it is); FSDP2 shards over
    ``mesh`` (default: a 1-D mesh of the whole world on ``device``'s type).

    fsdp2: ``fully_shard`` on every decoder layer, then on the root (embedding, final norm, head);
    with an amp precision its MixedPrecisionPolicy all-gathers parameters in the low precision and
    reduces gradients in fp32, and the step runs without autocast (torchtitan's recipe).
    """
    spec = parse_parallel(parallel)
    if spec.kind == "none":
        return Sharded(spec, model)
    if not dist.is_initialized() or dist.get_world_size() != spec.world_size:
        have = dist.get_world_size() if dist.is_initialized() else "no"
        raise RuntimeError(f"parallel {parallel} needs a process group of {spec.world_size} ranks, found {have}")
    if spec.kind == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return Sharded(spec, nn.parallel.DistributedDataParallel(model, device_ids=ids))
    return _fully_shard(model, spec, precision=precision, mesh=mesh or device_mesh(parallel, device))


def device_mesh(parallel: str, device: torch.device) -> Any:
    """FSDP2's 1-D mesh over the whole world (None unless ``parallel`` is fsdp2). Its rank table is a
    small host tensor, not device memory: make it outside the CPU tracker, as the estimator does."""
    from torch.distributed.device_mesh import init_device_mesh

    spec = parse_parallel(parallel)
    return init_device_mesh(device.type, (spec.world_size,)) if spec.kind == "fsdp2" else None


def _fully_shard(model: nn.Module, spec: ParallelSpec, *, precision: str, mesh: Any) -> Sharded:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    low = amp_dtype(precision)
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32) if low else MixedPrecisionPolicy()
    options: dict[str, Any] = {"mesh": mesh, "mp_policy": policy, "reshard_after_forward": spec.reshard_after_forward}
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return Sharded(spec, model, autocast=low is None)

