#!/usr/bin/env bash
# Stage 21 (issue 14): under an 80 GiB cap, the fewest checkpointed layers (first:k) within 76 GiB at batch
# 2, 4, 8 and 16 (configs/llama7b-fit-80g.yaml): "how many layers should I checkpoint?", measured.
# gpu-seconds: 140
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
ck_sweep configs/llama7b-fit-80g.yaml layout-fit
