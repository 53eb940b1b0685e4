#!/usr/bin/env bash
# Stage 52 (issue 14): torch.compile with first:16 at batch 2 and all at batch 8, LLaMA-7B
# (configs/llama7b-compile-layers.yaml).
# gpu-seconds: 230
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
ck_sweep configs/llama7b-compile-layers.yaml compile-layers
