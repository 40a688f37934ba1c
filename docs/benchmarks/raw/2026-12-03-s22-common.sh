# Shared by the round drivers: cd build-dev, logs under $OUT/r, `step NAME TIMEOUT CMD` (skipped when
# the round's BUDGET seconds are spent), `unpack NAME DEST` (a packed binary from build-dev/pack).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
L=${OUT:-/tmp/out}/r; mkdir -p "$L"
T0=$(date +%s)
: > "$L/summary.txt"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > "$L/machine.txt" 2>&1
step() {
  local name=$1 to=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ $left -lt 10 ]; then echo "$name skipped (budget)" | tee -a "$L/summary.txt"; return; fi
  [ $to -gt $left ] && to=$left
  local t=$(date +%s)
  timeout $to bash -c "$*" > "$L/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc in $(( $(date +%s) - t )) s" | tee -a "$L/summary.txt"
}
unpack() { xz -d -c "pack/$1.xz" > "$2" && chmod +x "$2"; }
