#!/usr/bin/env bash
# Stage 22 (issue 14): the points docs/answers.md still needs under an 80 GiB cap: range:8-12, last:4,
# offloading with 8 checkpointed layers, batch 1 x 8 micro-batches, amp_bf16 (configs/llama7b-claims-80g.yaml).
# gpu-seconds: 150
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
ck_sweep configs/llama7b-claims-80g.yaml claims
