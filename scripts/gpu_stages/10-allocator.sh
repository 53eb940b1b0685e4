#!/usr/bin/env bash
# Stage 10 of the GPU campaign (issue 12, "Will it fit?"): the data that checks the caching-allocator replay.
#   1. allocator traces: LLaMA-7B points and a model whose weights are not 2 MiB multiples, each in its own
#      process from an empty allocator (ckptbench trace-allocator), as compact JSON under $R/traces;
#      their records are fresh-process measurements;
#   2. in-process vs fresh: the same points swept in one process (after empty_cache between points);
#   3. the 80 GiB-cap batch_size: max search, started from the prediction (recorded before each probe);
#   4. the allocator axis on LLaMA-7B (expandable segments, max_split_size_mb, garbage collection);
#   5. allocator_summary.md: every prediction next to its measurement, the trace replays.
# Environment (scripts/gpu_check.sh): CK (the ckptbench command), PY (python), R (this stage's results folder),
# DRY=1 on CPU (tiny configs, seconds; steps that need CUDA are refused and say so). Exits 0 when done.
# About 4 minutes on one H200 (a fresh process costs ~15 s: imports, CUDA, building LLaMA-7B).
set -uo pipefail
: "${CK:=python3 -m ckptbench}" "${PY:=python3}" "${R:?set R to the folder for the results of this stage}"
mkdir -p "$R"
log() { echo "== $(date +%T) stage 10: $*" | tee -a "$R/stage10.log"; }
run() { "$@" 2>&1 | grep -v "━" | tee -a "$R/stage10.log"; return "${PIPESTATUS[0]}"; }

TRACES=configs/allocator-traces.yaml TRACES13=configs/allocator-traces-13b.yaml
SEARCH=configs/allocator-search80.yaml AXIS=configs/allocator-axis.yaml
if [ -n "${DRY:-}" ]; then
  # The same shapes of work on the tiny preset, on CPU (the live-tensor tracker; a cap in MiB).
  D="$R/dry-configs"; mkdir -p "$D"
  tiny() { printf 'name: %s\ndevice: cpu\nmodel: {preset: tiny}\nwarmup_steps: 1\nmeasured_steps: 1\n%s\n' "$1" "$2" > "$D/$1.yaml"; }
  tiny allocator-traces 'sweep: {layout: [none, all@mlp], batch_size: [2], seq_len: [64], precision: [fp32]}'
  tiny allocator-traces-13b 'sweep: {layout: [none], batch_size: [1], seq_len: [64], precision: [fp32]}'
  tiny allocator-search80 $'memory_cap_gib: 0.03\nsearch_max_batch: 8\nsweep: {layout: [all], batch_size: max, seq_len: [64], precision: [fp32]}'
  tiny allocator-axis 'sweep: {layout: [all], batch_size: [2], seq_len: [64], precision: [fp32]}'
  TRACES=$D/allocator-traces.yaml TRACES13=$D/allocator-traces-13b.yaml
  SEARCH=$D/allocator-search80.yaml AXIS=$D/allocator-axis.yaml
fi

log "allocator traces (each point in its own process)"
run $CK trace-allocator "$TRACES" --out "$R/traces" || log "no traces (needs a CUDA GPU)"
run $CK trace-allocator "$TRACES13" --out "$R/traces-13b" || log "no traces (needs a CUDA GPU)"
log "in-process: the traced points swept in one process"
run $CK sweep "$TRACES" --out "$R/inprocess" || log "in-process sweep failed"
run $CK sweep "$TRACES13" --out "$R/inprocess-13b" || log "in-process sweep failed"
log "80 GiB cap: batch_size: max from the prediction"
run $CK sweep "$SEARCH" --out "$R/search80" || log "search failed"
log "allocator axis"
run $CK sweep "$AXIS" --out "$R/axis" || log "allocator-axis sweep failed"
log "summary: predictions against measurements, trace replays"
run $PY scripts/allocator_summary.py "$R" || log "summary failed"
log "done"
exit 0
