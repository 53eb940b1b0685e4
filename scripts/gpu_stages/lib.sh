# Shared by the stage scripts of scripts/gpu_check.sh (sourced; not a stage: its name has no NN- prefix).
#
#   ck_sweep CONFIG NAME [ARG...]  print CONFIG's GPU-time estimate, then sweep it into $R/NAME (ARGs go to the
#                                  sweep: --isolate); with DRY=1 the sweep runs the config's tiny CPU form
#                                  (scripts/campaign.py dry), written next to the results.
#   step COMMAND...                run COMMAND; on failure say so and set failed=1 (the stage exits $failed at the end)
#   card_key                       the card `estimate --gpu` knows this GPU as (h200 without a GPU: DRY)

failed=0

ck_sweep() {
  local cfg=$1 name=$2
  shift 2
  $PY scripts/campaign.py estimate "$cfg"
  if [ -n "${DRY:-}" ]; then
    cfg=$($PY scripts/campaign.py dry "$cfg" "$R/dry-configs")
  fi
  $CK sweep "$cfg" --out "$R/$name" "$@"
}

step() { "$@" || { echo "stage $(basename "$R"): failed: $*"; failed=1; }; }

card_key() {
  $PY - <<'PY'
import torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
print("h100-80gb" if "H100" in name and "PCIe" not in name else "h100-pcie" if "H100" in name else "h200")
PY
}
