#!/usr/bin/env bash
# GPU check: GPU-marked tests, a short LLaMA-7B sweep (12 points), recommend/report at 80 GiB,
# a LLaMA-7B sweep over the technique axes, and the tool's overhead. Everything lands in one
# tarball under OUT (the device tool brings back at most 8 files).
#
#   scripts/gpu_check.sh [OUT_DIR]        # on a GPU machine (OUT_DIR defaults to $OUT or /tmp/ckptbench-gpu)
#   DRY=1 scripts/gpu_check.sh /tmp/dry   # plumbing check on CPU with configs/tiny.yaml
set -uo pipefail
OUT_DIR=${1:-${OUT:-/tmp/ckptbench-gpu}}
WORK=$(mktemp -d /tmp/ckptbench-gpu-XXXX)
mkdir -p "$OUT_DIR" "$WORK/results"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
PY=${PYTHON:-python3}
ck() { "$PY" -m ckptbench "$@"; }
log() { echo "== $(date +%T) $*"; }
CHECK=configs/llama7b-check.yaml AXES=configs/llama7b-axes.yaml
[ -n "${DRY:-}" ] && CHECK=configs/tiny.yaml AXES=configs/tiny.yaml
R=$WORK/results
{
  log "environment"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 || true
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  if [ -z "${DRY:-}" ]; then
    log "GPU-marked tests"
    "$PY" -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tail -15
  fi
  log "short LLaMA-7B sweep: $CHECK"
  ck sweep "$CHECK" --out "$R/check" 2>&1 | grep -v "━" | tail -40
  ck recommend "$R/check" --budget 80 2>&1 | tail -40
  ck report "$R/check" --budget 80 --out "$R/check/report" 2>&1 | tail -3
  if ck estimate --help >/dev/null 2>&1; then
    log "estimate (CPU-side prediction for the same points)"
    ck estimate "$CHECK" --format csv > "$R/check/estimate.csv" 2>/dev/null; tail -3 "$R/check/estimate.csv"
  fi
  log "technique axes on LLaMA-7B: $AXES"
  ck sweep "$AXES" --out "$R/axes" 2>&1 | grep -v "━" | tail -30
  log "overhead and estimate error"
  "$PY" scripts/gpu_summary.py "$R/check" "$R/axes"
  log "done"
} 2>&1 | tee "$R/gpu_check.log"
tar czf "$OUT_DIR/gpu_results.tar.gz" -C "$WORK" results
cp "$R/gpu_check.log" "$OUT_DIR/gpu_check.log"
echo "wrote $OUT_DIR/gpu_results.tar.gz"
