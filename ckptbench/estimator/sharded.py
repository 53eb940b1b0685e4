"""A sharded point's step on fake tensors: PyTorch's fake process group stands in for the other ranks.

One process plays one rank (rank 0 by default: FSDP2 gives it the largest shard of every parameter)
of a world of any size. The fake group's collectives move no data and complete at once, but
FSDP2 and DDP allocate their buffers as on the real group: all-gather outputs and unsharded
parameters, reduce-scatter inputs and outputs, DDP's gradient buckets. They are counted like any
other storage (the trace runs ckptbench's own ``train.parallel.shard``), including FSDP2's frees
and refills by storage resizing (estimator/live_storage.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from ckptbench.config.parallel import parse_parallel
from ckptbench.train.parallel import Sharded, device_mesh


@contextlib.contextmanager
def fake_process_group(parallel: str, *, rank: int = 0) -> Iterator[Any]:
    """A fake process group of the point's world size for the block, and its device mesh (None for
    'none'). The mesh is made here, before any FakeTensorMode: it reads its own (real) rank table."""
    spec = parse_parallel(parallel)
    if not spec.distributed:
        yield None
        return
    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank {rank} is not a rank of {parallel}")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process; estimate sharded points apart")
    # Importing it registers the 'fake' backend (PyTorch's own tool for tracing sharded steps in one process).
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=spec.world_size)
    try:
        with _no_parameter_check():
            yield device_mesh(parallel, torch.device("cpu"))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _no_parameter_check() -> Iterator[None]:
    """DDP's constructor checks that every rank has the same parameter shapes by reading the parameters'
    data, which fake tensors do not hold; the ranks of a fake group are one model, so skip the check."""
    import torch.nn.parallel.distributed as ddp

    original = ddp._verify_param_shape_across_processes
    ddp._verify_param_shape_across_processes = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ddp._verify_param_shape_across_processes = original


def complete_fake_buckets(sharded: Sharded) -> None:
    """DDP reads its all-reduce's result from the communication future, which the fake group leaves
    empty: give DDP a hook whose future holds the bucket itself (all-reduce works in place)."""
    if sharded.spec.kind != "ddp":
        return

    def hook(_state: object, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    # DDP checks the annotations as objects; this module's are strings (postponed evaluation).
    hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    sharded.forward.register_comm_hook(None, hook)  # type: ignore[operator]
