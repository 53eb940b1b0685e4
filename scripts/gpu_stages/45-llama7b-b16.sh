#!/usr/bin/env bash
# Stage 45 (issue 14): part of the full grid (configs/parts/llama7b-b16.yaml, 5 measured steps per point);
# the parts of configs/llama7b-a100.yaml come first (the card the answers are about), then configs/llama7b.yaml.
# gpu-seconds: 140
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
ck_sweep configs/parts/llama7b-b16.yaml llama7b-b16
