#!/usr/bin/env bash
# Session 27 round 3: the persistent ws walk as the default (SPARGE_GATHER_WS_PERSIST=0: per-tile): relaunch, the
# perf rows (per-tile next to the default), the gather suites, compare.py's token section.
TAG=s27r3; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu
step relaunch 60 "$B/gpu --filter='GATHER_GPU_WS_RELAUNCH'"
for i in 1 2; do step perf_$i 40 "$B/gpu --filter='GATHER_GPU_KV_PERF'"; done
( cd ../python && MAX_JOBS=8 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step gather 160 "$B/gpu --gtest_filter='GatherGpu.*:GatherGpuKv.*:GatherGpuLong.*:GatherGpuPerfPaths.*:GatherGpuFastPerf.*'"
wait $PB; tail -1 $L/pybuild.log | tee -a $L/summary.txt
step compare 60 "cd .. && python3 bench/compare.py --token-only --out $L --tag s27r3"
{ cat $L/summary.txt
  for f in relaunch gather; do echo "== $f"; grep -E "^\[  FAILED|^\[  PASSED|tests ran|Failure|FAILED TEST" $L/$f.log | head -12; grep -c "^\[       OK" $L/$f.log; done
  for i in 1 2; do echo "== perf_$i"; grep -E "^\[perf\]|gather profile" $L/perf_$i.log | grep -E "per-kv-head group_union=1 path=default (per-tile )?overlap=off union_variant=5:|check_lists=0|per-q-head group_union=1 path=default (per-tile )?overlap=off union_variant=5:|hd64|persistent" | sed -E 's/keys=2048 //; s/union overlap.*max/max/' | cut -c1-240; done
  echo "== compare"; grep -E "gather|topk_select" $L/compare.log | head -30; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
