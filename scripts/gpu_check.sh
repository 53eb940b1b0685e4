#!/usr/bin/env bash
# The GPU campaign: run the stage scripts scripts/gpu_stages/NN-name.sh in ascending NN (priority) order, skip
# the stages whose results are already committed, and pack OUT_DIR/gpu_results.tar.gz (plus the log) after every
# stage, so that a stage cut off by a time limit does not cost the earlier ones.
#
#   scripts/gpu_check.sh [OUT_DIR]        # on a GPU machine (OUT_DIR defaults to $OUT or /tmp/ckptbench-gpu)
#                                         # writes OUT_DIR/gpu_results.tar.gz, gpu_check.log, and the allocator
#                                         # traces and snapshots as gpu_traces.tgz.part-NN (15 MiB parts)
#   DRY=1 scripts/gpu_check.sh /tmp/dry   # every stage in tiny form on the CPU (plumbing; seconds per stage)
#   ONLY="05 20" ...                      # only these stages (numbers or names)
#   FORCE=1 ...                           # run stages even when their results are committed
#   GPU_BUDGET_S=780 ...                  # stop starting stages whose estimate no longer fits; stop a running
#                                         # stage (SIGINT: its finished points stay) when the budget is spent
#   CAMPAIGN=name ...                     # results/<name>/ (default gpu-campaign; dry-campaign with DRY=1)
#   STAGES=dir COMMITTED=dir ...          # other stage scripts / committed results (tests: tests/test_campaign.py)
#
# A stage runs as `bash scripts/gpu_stages/NN-name.sh` from the repository root with the environment
#   CK   the ckptbench command (python3 -m ckptbench; PYTHONPATH holds this checkout, nothing is installed)
#   PY   the python command
#   R    the folder for this stage's results; it is packed as results/$CAMPAIGN/NN-name/
#   DRY  1 on CPU: tiny configs, seconds
# and exits 0 when its work is done; then the driver writes R/DONE, otherwise R/INCOMPLETE. A stage is
# committed when results/$CAMPAIGN/NN-name/ holds a DONE file, or a run.json somewhere below and no INCOMPLETE.
# A '# gpu-seconds: N' line in a stage is its estimated GPU time (printed, and used with GPU_BUDGET_S). A stage
# with a '# required:' line must pass: when it fails, no later stage starts (a broken CUDA path would spend the
# session's GPU minutes on numbers nobody can trust); the summary says so.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-/tmp/ckptbench-gpu}}
STAGES=${STAGES:-scripts/gpu_stages}
COMMITTED=${COMMITTED:-results}
CAMPAIGN=${CAMPAIGN:-$([ -n "${DRY:-}" ] && echo dry-campaign || echo gpu-campaign)}
WORK=$(mktemp -d /tmp/ckptbench-gpu-XXXX)
ROOT=$WORK/results/$CAMPAIGN
LOG=$ROOT/gpu_check.log
mkdir -p "$OUT_DIR" "$ROOT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PY=${PYTHON:-python3} DRY=${DRY:-}
export CK="$PY -m ckptbench"
[ -n "$DRY" ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # tiny CPU steps: threads only contend
START=$(date +%s)
SUMMARY=()
STOPPED=""

log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
pack() {  # the results without the big files; those (allocator traces, snapshots) in parts of at most 15 MiB
  local big size
  tar czf "$OUT_DIR/gpu_results.tar.gz" -C "$WORK" --exclude='*.json.gz' --exclude='*.pickle' results && cp "$LOG" "$OUT_DIR/gpu_check.log"
  big=$(cd "$WORK" && find results \( -name '*.json.gz' -o -name '*.pickle' \) | sort)
  rm -f "$OUT_DIR"/gpu_traces.tgz.part-*
  if [ -n "$big" ]; then
    # shellcheck disable=SC2086  # one argument per file (names are ours: no spaces)
    tar czf "$WORK/gpu_traces.tgz" -C "$WORK" $big && split -b 15M -d "$WORK/gpu_traces.tgz" "$OUT_DIR/gpu_traces.tgz.part-"
  fi
  size=$(stat -c %s "$OUT_DIR/gpu_results.tar.gz")
  [ "$size" -gt $((15 * 1024 * 1024)) ] && log "warning: gpu_results.tar.gz is $size bytes; the device tool brings back 16 MiB per file"
  return 0
}
committed() {  # prints why a stage counts as committed, or nothing
  local dir=$COMMITTED/$CAMPAIGN/$1
  [ -d "$dir" ] || return 0
  if [ -f "$dir/DONE" ]; then echo "committed: $dir/DONE"
  elif [ ! -f "$dir/INCOMPLETE" ] && [ -n "$(find "$dir" -name run.json -print -quit)" ]; then echo "committed: $dir holds a run"
  fi
}
wanted() {  # ONLY lists numbers or names
  [ -z "${ONLY:-}" ] && return 0
  local w; for w in $ONLY; do [ "$w" = "$2" ] || [ "$w" = "$1" ] && return 0; done; return 1
}
estimate_of() { sed -n 's/^# gpu-seconds: *\([0-9][0-9]*\).*/\1/p' "$1" | head -n 1; }

run_stage() {
  local file=$1 name num est why left rc t0 secs
  name=$(basename "$file" .sh); num=${name%%-*}; est=$(estimate_of "$file")
  if ! wanted "$name" "$num"; then SUMMARY+=("$name: skipped (not in ONLY)"); return; fi
  if [ -n "$STOPPED" ]; then SUMMARY+=("$name: not started ($STOPPED failed: a required stage)"); return; fi
  why=$(committed "$name")
  if [ -n "$why" ] && [ -z "${FORCE:-}" ]; then SUMMARY+=("$name: skipped ($why)"); log "skip $name: $why"; return; fi
  left=""
  if [ -n "${GPU_BUDGET_S:-}" ]; then
    left=$((GPU_BUDGET_S - ($(date +%s) - START)))
    if [ -n "$est" ] && [ "$est" -gt "$left" ]; then
      SUMMARY+=("$name: skipped (estimate ${est} s > ${left} s of budget left)"); log "skip $name: estimate ${est} s, ${left} s left"; return
    fi
  fi
  export R=$ROOT/$name; mkdir -p "$R"
  log "stage $name (estimate ${est:-?} s${left:+, $left s of budget left})"
  t0=$(date +%s)
  if [ -n "$left" ]; then
    timeout --signal=INT --kill-after=30 "$left" bash "$file" 2>&1 | grep --line-buffered -v "━" | tee -a "$LOG"
  else
    bash "$file" 2>&1 | grep --line-buffered -v "━" | tee -a "$LOG"
  fi
  rc=${PIPESTATUS[0]}; secs=$(($(date +%s) - t0))
  if [ "$rc" -eq 0 ]; then echo "$name done in ${secs} s" > "$R/DONE"; else echo "exit $rc after ${secs} s" > "$R/INCOMPLETE"; fi
  SUMMARY+=("$name: ran, exit $rc, ${secs} s (estimate ${est:-?} s)")
  if [ "$rc" -ne 0 ] && grep -q '^# required:' "$file"; then
    STOPPED=$name; log "stage $name is required and failed: no later stage starts"
  fi
  log "stage $name: exit $rc after ${secs} s"
  pack
}

log "environment (campaign results/$CAMPAIGN${DRY:+, DRY: tiny configs on CPU})"
if [ -z "$DRY" ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
fi
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" 2>&1 | tee -a "$LOG"
pack
for file in $(find "$STAGES" -maxdepth 1 -name '[0-9][0-9]-*.sh' | sort); do
  run_stage "$file"
done
runs=$(find "$ROOT" -name run.json -printf '%h\n' | sort)
if [ -n "$runs" ]; then
  log "tool overhead (sweep wall time against warm-up + measured steps)"
  # shellcheck disable=SC2086  # one argument per run directory
  $PY scripts/gpu_summary.py $runs 2>&1 | tee -a "$LOG"
fi
log "summary ($(($(date +%s) - START)) s in all)"
printf '  %s\n' "${SUMMARY[@]}" | tee -a "$LOG"
pack
echo "wrote $OUT_DIR/gpu_results.tar.gz, $OUT_DIR/gpu_check.log and any gpu_traces.tgz.part-NN (unpack at the repository root: tar xzf gpu_results.tar.gz; cat gpu_traces.tgz.part-* | tar xz)"
