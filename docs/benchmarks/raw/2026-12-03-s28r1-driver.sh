#!/usr/bin/env bash
# Session 28 round 1 (HEAD ce2e2d9's binary): compute-sanitizer on the persistent ws walk (one CTA walking both tiles of
# GATHER_GPU_WS_SMALL's group: memcheck, racecheck, synccheck), then compare.py's full run with the persistent default
# (the Python build beside the sanitizer steps).
TAG=s28r1; BUDGET=${BUDGET:-520}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu
( cd ../python && MAX_JOBS=8 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
export SPARGE_GATHER_WS_PERSIST_CTAS=1
step memcheck 80 "compute-sanitizer --tool memcheck --error-exitcode 9 $B/gpu --filter='GATHER_GPU_WS_SMALL'"
step racecheck 100 "compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 $B/gpu --filter='GATHER_GPU_WS_SMALL'"
step synccheck 70 "compute-sanitizer --tool synccheck --error-exitcode 9 $B/gpu --filter='GATHER_GPU_WS_SMALL'"
unset SPARGE_GATHER_WS_PERSIST_CTAS
wait $PB; tail -1 $L/pybuild.log | tee -a $L/summary.txt
step compare 170 "cd .. && python3 bench/compare.py --d 128 --causal no --topk 0.4,0.1 --ab 40 --flex-blk 128,128x64 --token --out $L --tag s28r1"
{ cat $L/summary.txt; cat $L/machine.txt
  for t in memcheck racecheck synccheck; do echo "== $t"; grep -E "^\[  FAILED|^\[  PASSED|tests ran|ERROR SUMMARY|RACECHECK SUMMARY|hazard" $L/$t.log | head -8; grep -c "^\[       OK" $L/$t.log; done
  echo "== compare"; sed -n '/^Targets/,$p' $L/compare.log | head -40; grep -E "A/B x40:|gather union kv-lists|topk_select|sparge_attn|block map" $L/compare.log | head -30; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
