#!/usr/bin/env bash
# Stage 10 (issue 12, "Will it fit?"): the data that checks the caching-allocator replay.
#   1. allocator traces: LLaMA-7B points (configs/allocator-traces.yaml) and a model whose weights are not 2 MiB
#      multiples (configs/allocator-traces-13b.yaml), each point in its own process from an empty allocator
#      (ckptbench trace-allocator), as compact JSON under $R/traces*; their records are fresh-process measurements;
#   2. in-process vs fresh: the same points swept in one process ($R/inprocess*);
#   3. the 80 GiB-cap batch_size: max search, started from the prediction (configs/allocator-search80.yaml);
#   4. the allocator axis on LLaMA-7B (configs/allocator-axis.yaml);
#   5. $R/allocator_summary.md: every prediction next to its measurement, the trace replays.
# The estimate below counts the sweeps; the traces' and the fresh points' own processes add about 15 s each
# (imports, CUDA, building LLaMA-7B): about 4 minutes in all on one H200.
# gpu-seconds: 150
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there). Exits 1 when a step failed (the driver
# then marks the stage INCOMPLETE and a later session runs it again).
set -uo pipefail
. scripts/gpu_stages/lib.sh
failed=0
step() { "$@" || { echo "stage 10: failed: $*"; failed=1; }; }

if [ -n "${DRY:-}" ]; then
  echo "stage 10: trace-allocator records the CUDA allocator: no traces on CPU (DRY)"
else
  step $CK trace-allocator configs/allocator-traces.yaml --out "$R/traces"
  step $CK trace-allocator configs/allocator-traces-13b.yaml --out "$R/traces-13b"
fi
step ck_sweep configs/allocator-traces.yaml inprocess
step ck_sweep configs/allocator-traces-13b.yaml inprocess-13b
step ck_sweep configs/allocator-search80.yaml search80
step ck_sweep configs/allocator-axis.yaml axis
step $PY scripts/allocator_summary.py "$R"
exit $failed
