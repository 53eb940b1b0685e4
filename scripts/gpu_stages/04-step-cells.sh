#!/usr/bin/env bash
# Stage 04 (issue 37): step-time cells no committed run has (the step-time model's transfer to a second card
# is judged on them): LLaMA-7B at seq 4096 and 8192, fp16, foreach AdamW, eager attention, amp_bf16 (on 16 of
# its layers), and one point of each newly supported family at batch 2, seq 2048 (configs/gpu/*.yaml).
# gpu-seconds: 190
# Run by scripts/gpu_check.sh with CK, PY, R and DRY set (see there). Exits 1 when a step failed.
set -uo pipefail
. scripts/gpu_stages/lib.sh

step ck_sweep configs/gpu/cells-7b.yaml cells-7b
step ck_sweep configs/gpu/cells-7b-seq8192.yaml cells-7b-seq8192
step ck_sweep configs/gpu/cells-7b16-amp.yaml cells-7b16-amp
step ck_sweep configs/gpu/family-llama-3.1-8b.yaml family-llama-3.1-8b
step ck_sweep configs/gpu/family-mistral-7b.yaml family-mistral-7b
step ck_sweep configs/gpu/family-qwen2.5-7b.yaml family-qwen2.5-7b
step ck_sweep configs/gpu/family-qwen3-8b.yaml family-qwen3-8b
exit $failed
