#!/usr/bin/env bash
# Session 27 round 2: the persistent ws walk (SPARGE_GATHER_WS_PERSIST, opt-in) -- relaunch first (a hang ends at its
# timeout), then the gather suites with its bitwise pairs, its perf rows next to the default; the rest of the GPU suite
# (what s27r1's time limit left); compare.py once with the Python build beside the tests.
TAG=s27r2; BUDGET=${BUDGET:-540}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu
step ws_default 40 "$B/gpu --filter='GATHER_GPU_WS_RELAUNCH\\(runs=400,union,kv_lists\\)'"
step ws_persist 40 "$B/gpu --filter='GATHER_GPU_WS_RELAUNCH\\(runs=400,union,q_lists,persist'"
OKP=$(grep -c "^\[       OK" $L/ws_persist.log)
for i in 1 2; do step perf_$i 40 "$B/gpu --filter='GATHER_GPU_KV_PERF\\('"; done
( cd ../python && MAX_JOBS=8 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
if [ "$OKP" = "1" ]; then
  step gather 220 "$B/gpu --gtest_filter='GatherGpu.*:GatherGpuKv.*:GatherGpuLong.*'"
else
  echo "persistent relaunch failed: gather suites skipped" >> $L/summary.txt
fi
step rest 60 "$B/gpu --gtest_filter='GatherGpuPerfPaths.*:GatherGpuKvPerf64.*:GatherGpuFastPerf.*:GatherGpuTmaProbe.*'"
wait $PB; tail -1 $L/pybuild.log | tee -a $L/summary.txt
step compare 130 "cd .. && python3 bench/compare.py --d 128 --causal no --topk 0.4,0.1 --ab 40 --flex-blk 128,128x64 --token --out $L --tag s27r2"
{ cat $L/summary.txt
  for f in ws_default ws_persist gather rest; do echo "== $f"; grep -E "^\[  FAILED|^\[  PASSED|tests ran|Failure|expected|FAILED TEST" $L/$f.log | head -12; grep -c "^\[       OK" $L/$f.log; done
  for i in 1 2; do echo "== perf_$i"; grep -E "^\[perf\]|gather profile" $L/perf_$i.log | grep -E "per-kv-head group_union=1 path=default (persist )?overlap=off union_variant=5:|check_lists=0|per-q-head group_union=1 path=default persist|persistent" | sed -E 's/keys=2048 //; s/union overlap.*max/max/' | cut -c1-260; done
  echo "== compare"; sed -n '/^Targets/,$p' $L/compare.log | head -40; grep -E "A/B x40:" $L/compare.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
