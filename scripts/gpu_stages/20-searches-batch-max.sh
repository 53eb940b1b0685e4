#!/usr/bin/env bash
# Stage 20 (issue 14): under an 80 GiB cap, the largest batch each layout runs at seq 2048 with its peak
# reserved memory within 76 GiB (configs/llama7b-searches-80g.yaml); every probe's prediction is recorded
# before the sweep starts. Settles docs/answers.md claims 5 and 10 (batch 4).
# gpu-seconds: 150
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
. scripts/gpu_stages/lib.sh
ck_sweep configs/llama7b-searches-80g.yaml batch-max
