#!/usr/bin/env bash
# Session 11 round 8: racecheck details on GATHER_GPU_WS_SMALL (8 hazards in r7), split by path / switches.
TAG=s11r8; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack sparge_gpu_tests $B/new
T=$B/new
for v in "default:" "o_same:--filter=GATHER_GPU_WS_SMALL.*o=same" "o_f32:--filter=GATHER_GPU_WS_SMALL.*o=f32" "nopf:SPARGE_GATHER_PREFETCH=0" "wgmma:SPARGE_GATHER_PATH=wgmma" "arrivewait:SPARGE_GATHER_WS_ARRIVE=wait" "nopp:SPARGE_GATHER_WS_PINGPONG=0"; do
  name=${v%%:*}; arg=${v#*:}
  if [[ "$arg" == --filter* ]]; then envs=""; filt="$arg"; else envs="$arg"; filt="--filter=GATHER_GPU_WS_SMALL"; fi
  step rc_$name 40 "env $envs compute-sanitizer --tool racecheck --racecheck-report hazard $T '$filt' > $L/rc_$name.full 2>&1; grep -cE 'Race reported|Error' $L/rc_$name.full; grep -E 'RACECHECK SUMMARY' $L/rc_$name.full"
done
cat $L/summary.txt
for f in $L/rc_*.log; do echo "## $f"; cat $f; done
grep -m 12 -E -A6 'Race reported|Error:' $L/rc_default.full | head -80
