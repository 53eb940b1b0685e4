#!/usr/bin/env bash
# Stage 40 (issue 14): part of the full grid (configs/parts/llama7b-a100-b1-b2.yaml, 5 measured steps per point);
# the parts of configs/llama7b-a100.yaml come first (the card the answers are about), then configs/llama7b.yaml.
# gpu-seconds: 120
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
ck_sweep configs/parts/llama7b-a100-b1-b2.yaml llama7b-a100-b1-b2
