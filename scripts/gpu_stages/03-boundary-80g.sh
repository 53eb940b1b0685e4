#!/usr/bin/env bash
# Stage 03 (issue 37): the out-of-memory boundary `advise` decides on, measured on a real 80 GB card: LLaMA-7B at
# batch 8, seq 2048 (advise's fewest layers first:24 and its neighbours first:23 and first:25, its accumulation
# setups) and `all` at the largest batches (configs/gpu/boundary-80g.yaml), each point in a fresh process;
# $R/advise.txt is the answer the points check, as advise gave it before they ran.
# An 80 GB card only: on a bigger one the stage says so and stays INCOMPLETE (a later H100 session runs it).
# gpu-seconds: 200
# gpu-seconds-beyond-sweeps: 50 (9 fresh point processes, advise)
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there).
set -uo pipefail
. scripts/gpu_stages/lib.sh

card=$(card_key)
if [ -z "${DRY:-}" ] && [ "${card#h100}" = "$card" ]; then
  echo "stage 03: needs an 80 GB H100 (this is $card): not run"
  exit 1
fi
step bash -o pipefail -c "COLUMNS=160 $CK advise --model llama-7b --gpu h100-80gb --batch 8 --seq 2048 > '$R/advise.txt'"
step ck_sweep configs/gpu/boundary-80g.yaml boundary --isolate
exit $failed
