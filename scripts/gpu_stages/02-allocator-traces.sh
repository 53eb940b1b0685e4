#!/usr/bin/env bash
# Stage 02 (issues 12 and 37): the data that checks the caching-allocator replay.
#   1. allocator traces: LLaMA-7B points (configs/allocator-traces.yaml) and a model whose weights are not 2 MiB
#      multiples (configs/allocator-traces-13b.yaml), each point in its own process from an empty allocator
#      (ckptbench trace-allocator), as compact JSON under $R/traces*; their records are fresh-process measurements;
#      the traces are the fixtures of tests/test_allocator_traces.py (copy them to tests/fixtures/allocator_traces/);
#   2. in-process vs fresh: the same points swept in one process ($R/inprocess*);
#   3. $R/allocator_summary.md: every prediction next to its measurement, the trace replays.
# The estimate counts the sweeps; the traces' own processes add about 15 s each (imports, CUDA, the model).
# gpu-seconds: 130
# gpu-seconds-beyond-sweeps: 80 (4 trace processes, each building its model and running 3 steps)
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there). Exits 1 when a step failed (the driver
# then marks the stage INCOMPLETE and a later session runs it again).
set -uo pipefail
. scripts/gpu_stages/lib.sh

if [ -n "${DRY:-}" ]; then
  echo "stage 02: trace-allocator records the CUDA allocator: no traces on CPU (DRY)"
else
  step $CK trace-allocator configs/allocator-traces.yaml --out "$R/traces"
  step $CK trace-allocator configs/allocator-traces-13b.yaml --out "$R/traces-13b"
fi
step ck_sweep configs/allocator-traces.yaml inprocess
step ck_sweep configs/allocator-traces-13b.yaml inprocess-13b
step $PY scripts/allocator_summary.py "$R"
exit $failed
