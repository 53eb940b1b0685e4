#!/usr/bin/env bash
# The wheels the GPU campaign needs on a machine whose Python (3.12) has torch, transformers, typer, rich, pandas,
# PyYAML, matplotlib and scipy but not pydantic (the config's schema): downloaded here into .whl/ (ignored by git),
# carried to the machine and installed there into a folder of their own, nothing else touched:
#
#   bash scripts/device_wheels.sh                  # here, once: .whl/ (about 3 MB)
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#     && PYTHONPATH=/tmp/site GPU_BUDGET_S=510 PYTHON=python3 bash scripts/gpu_check.sh "$OUT"   # there
#
# The versions are this checkout's own (the ones its tests ran with), for CPython 3.12 on x86-64 Linux.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pins=$($PY - <<'PY'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in
               ("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions")))
PY
)
# shellcheck disable=SC2086  # one argument per pin
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pins
ls .whl
