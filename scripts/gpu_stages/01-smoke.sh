#!/usr/bin/env bash
# Stage 01 (issue 37): the CUDA path, before anything else is measured. The sweep's runner, fork server, point
# processes, record and snapshot export were rebuilt on CPU since the last GPU run; this stage shows they still
# measure on CUDA:
#   1. the GPU-marked tests (tests/test_gpu.py; 50 s on the H200);
#   2. configs/gpu/smoke-7b.yaml (three LLaMA-7B points) swept in one process ($R/inprocess) and again with
#      --isolate, each point in a fresh process ($R/isolated), each with its prediction;
#   3. one point's predicted segments (estimate --snapshot) beside the recorded ones (trace-allocator, then
#      --snapshot-from): $R/snapshot_compare.md.
# required: a failure here stops the campaign (scripts/gpu_check.sh), to be fixed before anything else runs.
# gpu-seconds: 170
# gpu-seconds-beyond-sweeps: 120 (the tests 50, the isolated sweep and its 3 processes 50, the trace and estimate 20)
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there). Exits 1 when a step failed.
set -uo pipefail
. scripts/gpu_stages/lib.sh

step bash -o pipefail -c "$PY -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tee '$R/gpu_tests.log'"
step ck_sweep configs/gpu/smoke-7b.yaml inprocess
step ck_sweep configs/gpu/smoke-7b.yaml isolated --isolate
card=$(card_key)
snap=configs/gpu/snapshot-7b.yaml
[ -n "${DRY:-}" ] && snap=$($PY scripts/campaign.py dry "$snap" "$R/dry-configs")
step bash -o pipefail -c "$CK estimate '$snap' --gpu $card --snapshot '$R/snapshot-predicted.pickle' --format csv > '$R/snapshot-predicted.csv'"
if [ -n "${DRY:-}" ]; then
  echo "stage 01: trace-allocator records the CUDA caching allocator: the prediction is set beside itself (DRY)"
  cp "$R/snapshot-predicted.pickle" "$R/snapshot-recorded.pickle"
else
  step $CK trace-allocator "$snap" --out "$R/snapshot-trace"
  trace=$(find "$R/snapshot-trace" -name '*.json.gz' | head -n 1)
  step $CK trace-allocator --snapshot-from "$trace" --out "$R/snapshot-recorded.pickle"
fi
# Unequal segments are a finding, not a failure of the CUDA path: the table says where they differ.
$PY scripts/compare_snapshots.py "$R/snapshot-predicted.pickle" "$R/snapshot-recorded.pickle" --out "$R/snapshot_compare.md"
[ $? -le 1 ] || failed=1
exit $failed
