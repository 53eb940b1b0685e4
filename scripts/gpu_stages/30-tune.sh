#!/usr/bin/env bash
# Stage 30: `ckptbench tune` of LLaMA-7B (seq 2048, bf16, full fine-tuning, fused AdamW) under an 80 GiB
# cap on the H200 (an A100-80GB), at most 25 measured points and about 6 minutes in all, then the
# report of the search. Target (issue 13): >= 12,000 tokens/s (best plain point: 10,548).
#
# gpu-seconds: 360
# (tune's own limit: about a minute of estimates on the host, then --time-budget 5; not a sweep estimate)
# Run by scripts/gpu_check.sh with CK (the ckptbench command), PY, R (this stage's results folder) and
# DRY (1 on CPU: the tiny config). Alone:  CK="python3 -m ckptbench" PY=python3 R=/tmp/r DRY=1 scripts/gpu_stages/30-tune.sh
# Optional packages (liger-kernel, cut-cross-entropy, torchao) are used when installed; otherwise those
# candidates are recorded as skipped ("not installed"). WHEELS=DIR installs wheels from DIR first (no network).
set -uo pipefail
: "${CK:?CK must name the ckptbench command}" "${R:?R must name the results folder}"
PY=${PY:-python3}
mkdir -p "$R"
if [ -n "${WHEELS:-}" ] && [ -d "$WHEELS" ]; then
  "$PY" -m pip install -q --no-deps --no-index "$WHEELS"/*.whl || echo "30-tune: could not install from $WHEELS"
fi
"$PY" - <<'PY' | tee "$R/optional_packages.txt"
import importlib.metadata as md
for name in ("liger-kernel", "cut-cross-entropy", "torchao", "bitsandbytes"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} not installed")
PY
if [ -n "${DRY:-}" ]; then
  CONFIG=configs/tiny.yaml BUDGET=46MiB LIMITS=(--max-points 3)
else
  # 5 minutes of measuring after the estimates (about a minute of CPU tracing on the GPU host): ~6 in all
  CONFIG=configs/llama7b-tune.yaml BUDGET=80 LIMITS=(--max-points 25 --time-budget 5)
fi
started=$(date +%s)
# shellcheck disable=SC2086  # CK is a command line
$CK tune "$CONFIG" --budget "$BUDGET" "${LIMITS[@]}" --out "$R/tune" 2>&1 | grep -v "━" | tee "$R/tune.txt"
status=${PIPESTATUS[0]}
echo "30-tune: tune took $(( $(date +%s) - started )) s (exit $status)" | tee -a "$R/tune.txt"
# The search as JSON (what `tune --format json` prints), read from run.json: no second estimate.
"$PY" -c 'import json, sys; m = json.load(open(sys.argv[1])); print(json.dumps([s for s in m.get("searches", []) if s.get("kind") == "tune"], indent=2, sort_keys=True))' \
  "$R/tune/run.json" > "$R/tune.json" || echo "30-tune: no JSON answer"
$CK report "$R/tune" --budget "$BUDGET" --out "$R/tune/report" > /dev/null || echo "30-tune: report failed"
exit "$status"
