#!/usr/bin/env bash
# Session 26 round 4: the V-staged epilogue with the late release (bit 2097152) against the immediate one and HEAD's
# binary ("old"), back to back; the attention GPU suites (Properties first: BSA_VSTAGED), memcheck on a late case.
TAG=s26r4; BUDGET=${BUDGET:-380}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/new; unpack trace_old $B/old; unpack gpu $B/gpu
export SPARGE_TRACE_HND=1
for i in 1 2 3; do
  step old_d01_$i 20 "SPARGE_TRACE_STEADY=600 $B/old 0.1 128 10 0"
  step new_d01_$i 20 "SPARGE_TRACE_STEADY=600 $B/new 0.1 128 10 0"
  step late_d01_$i 20 "SPARGE_SM90_VARIANT=2097152 SPARGE_TRACE_STEADY=600 $B/new 0.1 128 10 0"
done
for i in 1 2; do
  step old_p025_$i 20 "SPARGE_TRACE_STEADY=600 $B/old 0.098 64 10 0"
  step new_p025_$i 20 "SPARGE_TRACE_STEADY=600 $B/new 0.098 64 10 0"
  step late_p025_$i 20 "SPARGE_SM90_VARIANT=2097152 SPARGE_TRACE_STEADY=600 $B/new 0.098 64 10 0"
done
step old_d04 20 "SPARGE_TRACE_STEADY=200 $B/old 0.4 128 10 0"
step new_d04 20 "SPARGE_TRACE_STEADY=200 $B/new 0.4 128 10 0"
step late_d04 20 "SPARGE_SM90_VARIANT=2097152 SPARGE_TRACE_STEADY=200 $B/new 0.4 128 10 0"
unset SPARGE_TRACE_HND
step gpu_props 120 "$B/gpu --gtest_filter='AttentionGpuProperties.*'"
step memcheck 40 "compute-sanitizer --tool memcheck --error-exitcode 9 $B/gpu --gtest_filter='*BSA_VSTAGED_LATE*varlen*blkk=64*'"
step gpu_attn 200 "$B/gpu --gtest_filter='AttentionGpuSparse.*:AttentionGpuDense.*'"
{ cat $L/summary.txt; for f in $L/old*.log $L/new*.log $L/late*.log; do echo "== $(basename $f)"; grep -E "steady|epilogue|tile \(e0|ctor" $f; done;
  for t in gpu_props gpu_attn memcheck; do echo "== $t"; grep -E "^\[  FAILED|^\[  PASSED|tests ran|ERROR SUMMARY" $L/$t.log | tail -12; grep -c "^\[       OK" $L/$t.log; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
