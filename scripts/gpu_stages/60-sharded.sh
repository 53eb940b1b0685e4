#!/usr/bin/env bash
# Stage 60 (issue 15): sharded points on one GPU with NCCL: LLaMA-7B bf16 batch 2 as one rank of FSDP2
# (fsdp2:1) and of DDP (ddp:1), layouts none and all (configs/llama7b-sharded.yaml). Each point runs in
# its own process (a world of one rank); the sweep records the estimate made before the run next to
# each measured peak. Checks the NCCL plumbing and the single-rank memory against the unsharded
# numbers of results/h200-gpu-check-2 (none 62.07 GiB, all 50.67 GiB at batch 2): DDP should add its
# gradient buckets (about the size of the bf16 gradients, 12.55 GiB), FSDP2 one layer's gathered
# parameters at a time. Multi-GPU figures stay estimates (`ckptbench estimate --parallel fsdp2:8`).
# With DRY=1 the config's CPU form runs each sharded point as 2 gloo ranks (scripts/campaign_lib/shrink.py).
# gpu-seconds: 120
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
$CK estimate configs/llama7b-sharded.yaml --format markdown > "$R/estimate.md"
ck_sweep configs/llama7b-sharded.yaml sharded
