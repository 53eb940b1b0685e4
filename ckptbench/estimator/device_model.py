"""Kernel models: what the target device does differently from the fake (CPU-shaped) step.

The estimator runs the real step on fake CPU tensors (PyTorch cannot fake CUDA tensors on a
CPU-only build: autograd needs a CUDA device guard). Every op's outputs have the same shapes
and dtypes on both devices, and the tensors an op saves for backward are chosen by autograd
formulas that do not depend on the device. What differs is modelled here:

``cpu``  exactly what ckptbench's live-tensor tracker measures on CPU: storage bytes as they are.

``cuda`` what ``torch.cuda.max_memory_allocated`` counts on an NVIDIA GPU:

- the caching allocator rounds every allocation up to a multiple of 512 bytes (a request of
  1..511 bytes takes 512; zero bytes take none), and counts the block it hands out: a request
  above 10 MiB gets a segment rounded up to 2 MiB, which is split only when more than 1 MiB
  would remain, so e.g. a 43 MiB tensor (LLaMA-7B's MLP activation at 2048 tokens) counts 44 MiB.
  Repeated steps reuse those blocks, so the same rule holds in the measured window;
- attention: on CPU, sdpa runs ``_scaled_dot_product_flash_attention_for_cpu``; on CUDA (bf16 or
  fp16, head_dim <= 256, no mask) a fused flash/cuDNN kernel. Both save q, k, v, the output (laid
  out as B x S x H x D, so transformers' ``transpose(1, 2).contiguous()`` copies nothing) and an
  fp32 logsumexp of B x H x S, never the S x S matrix, so the fake forward already has the CUDA
  bytes. The CUDA backward (FlashAttention-2, ``mha_bwd``) also holds, while it runs, an fp32
  dQ accumulator (B x S rounded up to 128 x H x D rounded up to 32) and an fp32 softmax-dO sum
  (B x H x S rounded up to 128), plus full-head dK/dV buffers when K/V have fewer heads (GQA);
- softmax backward (eager attention): CUDA's ``softmax_backward_cuda_out`` first computes
  ``grad * output`` into a temporary of the gradient's size, which the fused CPU kernel does not
  (log-softmax backward, used by the loss, has no such temporary);
- embedding backward: CUDA's ``embedding_dense_backward`` with more than 3072 tokens sorts the
  indices and sums partial segments in an fp32 buffer of (tokens / 10 + min(tokens, vocab)) x
  hidden, plus int64 index buffers, held while the kernel runs;
- cuBLAS keeps one workspace per (thread, stream) handle, allocated through the caching
  allocator on first use and kept: the forward (main thread) and the backward (autograd's
  device thread) each get one, 32 MiB by default on Hopper (``CUBLAS_WORKSPACE_CONFIG``). Being
  held from before the step to its end, and of the card's size, they are not in the trace (one
  trace serves every card): the Estimator adds them under every byte vector (``_persistent``);
- fused AdamW (``_fused_adamw_``) updates in place and allocates nothing, as on CPU; non-fused
  Adam keeps its ``step`` counters on the host, so they are not GPU memory;
- fp32 attention on CUDA uses the memory-efficient kernel, which saves the same tensors (its
  backward scratch is not modelled); eager attention and autocast behave as on CPU for LLaMA's
  ops (linear, matmul and sdpa run in the low precision on both, norms and the loss in fp32).

What is not modelled: which cached block serves a request depends on the allocator's history;
a request served by a larger free block whose remainder is 1 MiB or less counts up to 1 MiB more.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ckptbench.estimator.gpus import block_bytes

_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_EMBEDDING_BWD = torch.ops.aten.embedding_dense_backward.default
_SOFTMAX_BWD = torch.ops.aten._softmax_backward_data.default

_EMBEDDING_FAST_PATH_TOKENS = 3072
_EMBEDDING_ROWS_PER_THREAD = 10


class KernelModel(Protocol):
    """How the target device stores tensors and which scratch memory its kernels hold."""

    def block_bytes(self, nbytes: int) -> int: ...
    def workspace_bytes(self, func: Any, args: tuple[Any, ...], out: Any) -> int: ...
    def workspace_buffers(self, func: Any, args: tuple[Any, ...], out: Any) -> list[int]: ...
    def host_resident(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]: ...


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class CpuKernels:
    """The CPU live-tensor tracker's view: exact storage bytes, no hidden scratch."""

    target = "cpu"

    def block_bytes(self, nbytes: int) -> int:
        return nbytes

    def workspace_bytes(self, func: Any, args: tuple[Any, ...], out: Any) -> int:
        return 0

    def workspace_buffers(self, func: Any, args: tuple[Any, ...], out: Any) -> list[int]:
        return []

    def host_resident(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return []


class CudaKernels:
    """The CUDA caching allocator's view (see the module docstring for what is modelled)."""

    target = "cuda"

    def block_bytes(self, nbytes: int) -> int:
        return block_bytes(nbytes)

    def workspace_bytes(self, func: Any, args: tuple[Any, ...], out: Any) -> int:
        """Bytes of the scratch buffers ``func`` holds while it runs, each rounded as the allocator rounds it."""
        return sum(self.block_bytes(n) for n in self.workspace_buffers(func, args, out))

    def workspace_buffers(self, func: Any, args: tuple[Any, ...], out: Any) -> list[int]:
        """The scratch buffers ``func`` allocates after its outputs (request sizes, in allocation order)."""
        if func is _FLASH_BWD:
            return self._attention_backward(args[1], args[2])
        if func is _SOFTMAX_BWD:
            grad = args[0]
            return [grad.numel() * grad.element_size()]  # tmp = grad * output
        if func is _EMBEDDING_BWD:
            return self._embedding_backward(args[0], args[1], num_weights=int(args[2]), scale=bool(args[4]))
        return []

    def _attention_backward(self, query: torch.Tensor, key: torch.Tensor) -> list[int]:
        # flash-attn's mha_bwd: softmax_d, then dq_accum, then (GQA) dk_expanded and dv_expanded.
        batch, heads, seq_q, head_dim = query.shape
        seq_rounded = _round_up(seq_q, 128)
        dim_rounded = _round_up(head_dim, 32) if head_dim <= 192 else 256
        buffers = [batch * heads * seq_rounded * 4, batch * seq_rounded * heads * dim_rounded * 4]
        if key.shape[1] != heads:  # GQA: dK and dV for every query head, summed afterwards
            buffers += 2 * [batch * key.shape[2] * heads * head_dim * key.element_size()]
        return buffers

    def _embedding_backward(
        self, grad: torch.Tensor, indices: torch.Tensor, *, num_weights: int, scale: bool
    ) -> list[int]:
        tokens = indices.numel()
        if tokens <= _EMBEDDING_FAST_PATH_TOKENS and not scale:
            return []  # one atomic-add kernel straight into the gradient
        index_bytes = indices.element_size()
        segments = min(tokens, num_weights)
        partials = tokens // _EMBEDDING_ROWS_PER_THREAD + segments
        acc_bytes = 8 if grad.dtype == torch.float64 else 4
        counts = [tokens, tokens, tokens, segments, segments, partials]  # sorted, orig, offsets, ...
        # ... two device-side counters, and the partial sums
        return [n * index_bytes for n in counts] + [8, 8, partials * grad.shape[-1] * acc_bytes]

    def host_resident(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """Adam's step counters stay on the host unless the optimizer is fused or capturable."""
        out: list[torch.Tensor] = []
        for group in optimizer.param_groups:
            if group.get("fused") or group.get("capturable"):
                continue
            for p in group["params"]:
                step = optimizer.state.get(p, {}).get("step")
                if isinstance(step, torch.Tensor):
                    out.append(step)
        return out


def kernel_model(target: str) -> CpuKernels | CudaKernels:
    """The kernel model for ``target`` ('cpu' or 'cuda')."""
    if target == "cpu":
        return CpuKernels()
    if target == "cuda":
        return CudaKernels()
    raise ValueError(f"unknown estimate target {target!r}; allowed: cpu, cuda")
