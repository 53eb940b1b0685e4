#!/usr/bin/env bash
# Stage 05: the GPU-marked tests (tests/test_gpu.py): CUDA peaks follow the layout, an OOM is a row and
# releases its memory, offloading and selective checkpointing run. They check the plumbing the later stages
# use; on CPU (DRY=1) pytest skips them. 102 s in results/h200-gpu-check-2/gpu_check.log.
# gpu-seconds: 110
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -euo pipefail
$PY -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$R/gpu_tests.log"
