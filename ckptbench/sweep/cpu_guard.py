"""Whether a sweep is reasonable on a CPU: its training FLOPs against this host's measured matmul rate.

A 7B model trains at a few tokens a second on a CPU, so a grid of it runs for days: the sweep refuses
before it starts unless forced, and says for how long it would run. The duration is a lower bound:
6N FLOPs per token (N: the decoder's and LM head's matmul parameters; attention scores, recomputation
and everything that is not a matmul left out) over the rate of one large fp32 matmul on this host.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from ckptbench.config.schema import SweepConfig
from ckptbench.errors import RunFailure

REFUSE_ABOVE_S = 3600.0  # a CPU sweep predicted to run longer than this needs --force


@dataclass(frozen=True)
class CpuCost:
    """A lower bound of a sweep's training time on this CPU, and what it rests on."""

    flops: float  # 6N per token x tokens x steps, every point
    rate_flops_per_s: float  # measured: one fp32 matmul on this host with the config's threads
    points: int

    @property
    def seconds(self) -> float:
        return self.flops / self.rate_flops_per_s


def matmul_params(resolved: dict[str, Any]) -> int:
    """N in 6N for a LLaMA config (attention with grouped KV heads, the gated MLP, the LM head)."""
    hidden, inter = int(resolved["hidden_size"]), int(resolved["intermediate_size"])
    heads = int(resolved["num_attention_heads"])
    kv = int(resolved.get("num_key_value_heads") or heads)
    head_dim = int(resolved.get("head_dim") or hidden // heads)
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim
    layers = int(resolved["num_hidden_layers"])
    return layers * (attn + 3 * hidden * inter) + hidden * int(resolved["vocab_size"])


def training_flops(cfg: SweepConfig) -> float:
    """6N FLOPs per token over every point's warm-up and measured steps (searches count their grid points)."""
    n = matmul_params(cfg.model.resolved())
    steps = cfg.warmup_steps + cfg.measured_steps
    return sum(6.0 * n * p.tokens * steps for p in cfg.points_list() if p.batch_size is not None)


def host_matmul_rate(*, threads: int, seconds: float = 0.2) -> float:
    """FLOP/s of repeated 1024x1024 fp32 matmuls on this host with ``threads`` intra-op threads (measured)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(1024, 1024)
        torch.mm(a, a)  # warm-up
        runs, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            torch.mm(a, a)
            runs += 1
        return 2.0 * 1024**3 * runs / elapsed
    except (RuntimeError, MemoryError) as exc:
        # Each of the threads reserves its stack: 1024 of them under a memory limit (ulimit -v, a container) leave
        # no room for a 4 MiB tensor, or for one more thread. The points would fail the same way.
        reason = " ".join(str(exc).split()).removeprefix("[enforce fail at alloc_cpu.cpp:127] err == 0. ")[:120]
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        raise RunFailure(f"cpu_threads: {threads}: this host cannot run torch with {threads} threads ({reason}); "
                         f"lower cpu_threads (this process may use {cpus} CPUs)") from None
    finally:
        torch.set_num_threads(before)


def cpu_cost(cfg: SweepConfig) -> CpuCost:
    """The sweep's lower-bound training time on this CPU."""
    return CpuCost(training_flops(cfg), host_matmul_rate(threads=cfg.cpu_threads), len(cfg.points_list()))
