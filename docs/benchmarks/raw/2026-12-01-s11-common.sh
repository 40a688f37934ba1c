# Shared by the round drivers: run from build-dev/drv/X.sh on the device; logs under $OUT/r.
set -u
cd "$(dirname "$0")/.."
L=$OUT/r; mkdir -p "$L"
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; date -u; } > "$L/machine.txt" 2>&1
step() {
  local name=$1 to=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt 5 ]; then echo "$name skipped (budget)" >> "$L/summary.txt"; return; fi
  [ "$to" -gt "$left" ] && to=$left
  local t=$(date +%s)
  timeout "$to" bash -c "$*" > "$L/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t ))s" >> "$L/summary.txt"
}
unpack() {  # unpack NAME.xz DEST
  xz -dc "pack/$1.xz" > "$2" && chmod +x "$2"
}
