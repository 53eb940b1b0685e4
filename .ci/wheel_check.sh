#!/usr/bin/env bash
# A plain install works fully: ckptbench built as a wheel (not editable), installed apart from the checkout, and
# `ckptbench advise` run from another folder prints step times (the calibration ships as package data; nothing is
# read from the checkout's results/ or configs/). Runs inside CI's virtual environment (the dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
here="$(pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" .
python -m pip install -q --no-deps --no-compile --target "$work/site" "$work"/dist/ckptbench-*.whl
cd "$work"  # not the checkout
PYTHONPATH="$work/site" python - <<'PY'
import json, subprocess, sys
import ckptbench
assert "/site/ckptbench/" in ckptbench.__file__, ckptbench.__file__  # the wheel, not the checkout
out = subprocess.run([sys.executable, "-m", "ckptbench", "advise", "--model", "llama-7b", "--gpu", "a100-80gb",
                      "--batch", "2", "--seq", "2048", "--precision", "bf16", "--format", "json"],
                     capture_output=True, text=True, check=True).stdout
rows = json.loads(out)["tables"][0]["rows"]
times = [r["step_time_s"] for r in rows if r["fits"]]
assert times and all(t["value"] and t["label"] == "transferred" for t in times), times
print(f"wheel check: advise from {ckptbench.__file__} printed {len(times)} step times ({times[0]['value']:.2f} s)")
PY
cd "$here"
