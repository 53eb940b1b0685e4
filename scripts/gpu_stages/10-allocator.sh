#!/usr/bin/env bash
# Stage 10 (issue 12, "Will it fit?"): the rest of the allocator's checks (its traces are stage 02's):
#   1. the 80 GiB-cap batch_size: max search, started from the prediction (configs/allocator-search80.yaml);
#   2. the allocator axis on LLaMA-7B (configs/allocator-axis.yaml);
#   3. $R/allocator_summary.md: every prediction next to its measurement.
# gpu-seconds: 100
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there). Exits 1 when a step failed (the driver
# then marks the stage INCOMPLETE and a later session runs it again).
set -uo pipefail
. scripts/gpu_stages/lib.sh

step ck_sweep configs/allocator-search80.yaml search80
step ck_sweep configs/allocator-axis.yaml axis
step $PY scripts/allocator_summary.py "$R"
exit $failed
