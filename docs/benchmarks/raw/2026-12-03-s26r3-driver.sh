#!/usr/bin/env bash
# Session 26 round 3: the V-staged epilogue. Trace A/B back to back (HEAD's binary "old" vs the new one), the
# attention GPU suites, compare.py (kernel vs FlexAttention A/B at topk 0.4 / 0.1, both block shapes), memcheck.
TAG=s26r3; BUDGET=${BUDGET:-585}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/new; unpack trace_old $B/old; unpack gpu $B/gpu
( cd ../python && MAX_JOBS=14 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
export SPARGE_TRACE_HND=1
for i in 1 2 3; do
  step old_d01_$i 20 "SPARGE_TRACE_STEADY=600 $B/old 0.1 128 10 0"
  step new_d01_$i 20 "SPARGE_TRACE_STEADY=600 $B/new 0.1 128 10 0"
done
step newoff_d01 20 "SPARGE_SM90_VARIANT=1048576 SPARGE_TRACE_STEADY=600 $B/new 0.1 128 10 0"
for i in 1 2; do
  step old_p025_$i 20 "SPARGE_TRACE_STEADY=600 $B/old 0.098 64 10 0"
  step new_p025_$i 20 "SPARGE_TRACE_STEADY=600 $B/new 0.098 64 10 0"
  step old_d04_$i 20 "SPARGE_TRACE_STEADY=200 $B/old 0.4 128 10 0"
  step new_d04_$i 20 "SPARGE_TRACE_STEADY=200 $B/new 0.4 128 10 0"
done
step gpu_attn 150 "$B/gpu --gtest_filter='AttentionGpu*'"
wait $PB; echo "$(tail -1 $L/pybuild.log) (background, $(( $(date +%s) - T0 )) s into the round)" | tee -a $L/summary.txt
unset SPARGE_TRACE_HND
step compare 250 "cd .. && python3 bench/compare.py --d 128 --causal no --topk 0.4,0.1 --ab 40 --flex-blk 128,128x64 --out $L --tag s26r3"
step memcheck 60 "compute-sanitizer --tool memcheck --error-exitcode 9 $B/gpu --gtest_filter='*BSA_VSTAGED*varlen*blkk=128*'"
{ cat $L/summary.txt; for f in $L/old*.log $L/new*.log; do echo "== $(basename $f)"; grep -E "steady|epilogue|tile \(e0|ctor" $f; done;
  echo "== gpu"; grep -E "^\[  FAILED|^\[  PASSED|tests ran" $L/gpu_attn.log | tail -30; echo "== memcheck"; tail -4 $L/memcheck.log;
  sed -n '/^Targets/,$p' $L/compare.log; grep -E "A/B x40:" $L/compare.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
