#!/usr/bin/env bash
# Session 28 round 3: lazy rescaling (attn::lazy_max) in the gather ws consumers and the vote-off fp16/bf16 sm90 LUT and
# dense kernels, and the key-slot __syncwarp of the persistent walk. racecheck on the persistent walk again; gather perf
# and the trace harness, old (HEAD ce2e2d9) and new binaries alternated; the gather suites; compare.py (Python build beside).
TAG=s28r3; BUDGET=${BUDGET:-580}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu; unpack gpu_old $B/old; unpack trace $B/t_new; unpack trace_old $B/t_old
( cd ../python && MAX_JOBS=8 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step racecheck 60 "SPARGE_GATHER_WS_PERSIST_CTAS=1 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 10000000 $B/gpu --filter='GATHER_GPU_WS_SMALL' | grep -E '^=========     (Read|Write) |SUMMARY|PASSED|FAILED' | sed -E 's/Thread \\([0-9]+,[0-9]+,[0-9]+\\)//; s/\\+0x[0-9a-f]+//' | sort | uniq -c | sort -rn | head -20"
P="--filter='GATHER_GPU_KV_PERF\\('"
for i in 1 2; do
  step g_old_$i 30 "$B/old $P"
  step g_new_$i 30 "$B/gpu $P"
done
export SPARGE_TRACE_HND=1
for i in 1 2 3; do
  step t_old_d01_$i 20 "SPARGE_TRACE_STEADY=600 $B/t_old 0.1 128 10 0"
  step t_new_d01_$i 20 "SPARGE_TRACE_STEADY=600 $B/t_new 0.1 128 10 0"
done
step t_old_d04 20 "SPARGE_TRACE_STEADY=200 $B/t_old 0.4 128 10 0"
step t_new_d04 20 "SPARGE_TRACE_STEADY=200 $B/t_new 0.4 128 10 0"
unset SPARGE_TRACE_HND
step gather 170 "$B/gpu --gtest_filter='GatherGpu.*:GatherGpuKv.*:GatherGpuLong.*:GatherGpuPerfPaths.*:GatherGpuFastPerf.*'"
wait $PB; tail -1 $L/pybuild.log | tee -a $L/summary.txt
step compare 170 "cd .. && python3 bench/compare.py --d 128 --causal no --topk 0.4,0.1 --ab 40 --flex-blk 128,128x64 --token --out $L --tag s28r3"
{ cat $L/summary.txt; cat $L/machine.txt
  echo "== racecheck"; cat $L/racecheck.log
  for f in $L/g_*.log; do echo "== $(basename $f)"; grep -E "^\[perf\] gather hd128 keys=2048 lists=per-kv-head group_union=1 path=default (per-tile )?overlap|gather profile.*kv-head lists.*ws|^\[perf\] gather hd64 lists=per-kv-head keys=2048 group_union=1 path=default" $f | head -6 | sed -E 's/keys=2048 //; s/union overlap.*max/max/' | cut -c1-230; done
  for f in $L/t_*.log; do echo "== $(basename $f)"; grep -E "steady|tile \(e0|ctor" $f | head -4; done
  echo "== gather"; grep -E "^\[  FAILED|^\[  PASSED|tests ran|Failure|FAILED TEST" $L/gather.log | head -12; grep -c "^\[       OK" $L/gather.log
  echo "== compare"; sed -n '/^Targets/,$p' $L/compare.log | head -40; grep -E "A/B x40:|gather union kv-lists|topk_select|sparge_attn|block map" $L/compare.log | head -30; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
