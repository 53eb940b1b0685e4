# Shared by the stage scripts of scripts/gpu_check.sh (sourced; not a stage: its name has no NN- prefix).
#
#   ck_sweep CONFIG NAME   print CONFIG's GPU-time estimate, then sweep it into $R/NAME; with DRY=1 the sweep runs
#                          the config's tiny CPU form (scripts/campaign.py dry), written next to the results.

ck_sweep() {
  local cfg=$1 name=$2
  $PY scripts/campaign.py estimate "$cfg"
  if [ -n "${DRY:-}" ]; then
    cfg=$($PY scripts/campaign.py dry "$cfg" "$R/dry-configs")
  fi
  $CK sweep "$cfg" --out "$R/$name"
}
