#!/usr/bin/env bash
# Stage 23 (issue 14): without checkpointing, the largest batch within 76 GiB at seq 1024 and 512 under an
# 80 GiB cap (configs/llama7b-seq-80g.yaml): docs/answers.md claim 10.
# gpu-seconds: 70
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
ck_sweep configs/llama7b-seq-80g.yaml seq
