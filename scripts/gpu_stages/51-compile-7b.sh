#!/usr/bin/env bash
# Stage 51 (issue 14): torch.compile with and without checkpointing every layer, LLaMA-7B batch 2
# (configs/llama7b-compile.yaml). Compiling takes most of the time: no committed run has measured it yet.
# gpu-seconds: 210
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
ck_sweep configs/llama7b-compile.yaml compile
