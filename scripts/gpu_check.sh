#!/usr/bin/env bash
# GPU check: a short LLaMA-7B sweep (configs/llama7b-check.yaml), recommend/report at 80 GiB, a
# LLaMA-7B sweep over the technique axes, the GPU-marked tests, and the tool's overhead. Results are
# packed into OUT_DIR/gpu_results.tar.gz after every stage (the device tool brings back at most 8
# files, and a stage cut off by a time limit must not cost the earlier ones).
#
#   scripts/gpu_check.sh [OUT_DIR]        # on a GPU machine (OUT_DIR defaults to $OUT or /tmp/ckptbench-gpu)
#   DRY=1 scripts/gpu_check.sh /tmp/dry   # plumbing check on CPU with configs/tiny.yaml
#   SKIP_AXES=1 ...                        # leave out the technique-axes sweep
set -uo pipefail
OUT_DIR=${1:-${OUT:-/tmp/ckptbench-gpu}}
WORK=$(mktemp -d /tmp/ckptbench-gpu-XXXX)
R=$WORK/results
mkdir -p "$OUT_DIR" "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
PY=${PYTHON:-python3}
CHECK=configs/llama7b-check.yaml AXES=configs/llama7b-axes.yaml
[ -n "${DRY:-}" ] && CHECK=configs/tiny.yaml AXES=configs/tiny.yaml
ck() { "$PY" -m ckptbench "$@"; }
log() { echo "== $(date +%T) $*" | tee -a "$R/gpu_check.log"; }
run() { "$@" 2>&1 | grep -v "━" | tee -a "$R/gpu_check.log"; }
pack() { tar czf "$OUT_DIR/gpu_results.tar.gz" -C "$WORK" results; cp "$R/gpu_check.log" "$OUT_DIR/"; }

log "environment"
run nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
run "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
log "short LLaMA-7B sweep: $CHECK"
run ck sweep "$CHECK" --out "$R/check"
pack
log "recommend and report at an 80 GiB budget"
run ck recommend "$R/check" --budget 80
run ck report "$R/check" --budget 80 --out "$R/check/report"
pack
if [ -z "${SKIP_AXES:-}" ]; then
  log "technique axes on LLaMA-7B: $AXES"
  run ck sweep "$AXES" --out "$R/axes"
  pack
fi
if [ -z "${DRY:-}" ]; then
  log "GPU-marked tests"
  run "$PY" -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
fi
log "overhead (sweep wall time vs warm-up + measured steps)"
run "$PY" scripts/gpu_summary.py "$R"/check ${SKIP_AXES:+} $( [ -z "${SKIP_AXES:-}" ] && echo "$R/axes")
log "done"
pack
echo "wrote $OUT_DIR/gpu_results.tar.gz"
