#!/usr/bin/env bash
# Session 24 round 2: the whole GPU suite at HEAD (81f0054's kernels: session 23's final code, owed since s23r4's
# step limit), then the paired 128 x 64 and the 128 x 128 LUT kernels at density 0.1 in the trace harness
# (stamped, mode 0, and timed back to back, mode 4).
TAG=s24r2; BUDGET=${BUDGET:-570}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
unpack gpu $B/gpu
step suite 460 "$B/gpu --filter='^(?!BENCH)'"
for k in 64 128; do
  step t01_k${k}_m0 20 "$B/trace 0.1 $k 40 0"
  step t01_k${k}_m4 20 "SPARGE_TRACE_STEADY=600 $B/trace 0.1 $k 40 4"
done
{ cat $L/summary.txt; grep -E '^\[  (PASSED|FAILED)' $L/suite.log | head -40; tail -3 $L/suite.log
  for f in $L/t01*.log; do echo "== $(basename $f)"; cat $f | head -60; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
