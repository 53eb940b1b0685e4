#!/usr/bin/env bash
# Stage 50 (issue 14): shapes for the estimator (issue 12): LLaMA-13B, whose weights are not 2 MiB multiples
# (configs/llama13b-estimator.yaml), and mixed precision, amp_bf16 (configs/llama7b-amp.yaml), on the whole card.
# gpu-seconds: 70
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
ck_sweep configs/llama13b-estimator.yaml llama13b
ck_sweep configs/llama7b-amp.yaml amp
