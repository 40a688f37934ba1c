#!/usr/bin/env bash
# Session 25 round 2: the LUT kernels taking a held tile's coordinates from the look-ahead (default) against making
# them at the tile start (SPARGE_SM90_VARIANT=1048576, the former code), back to back in the trace harness (mode 4, no
# stamps; O digests must agree), then the whole GPU suite at this code.
TAG=s25r2; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
unpack gpu $B/gpu
for i in 1 2 3; do
  for v in 0 1048576; do
    step ab_k128_d01_v${v}_$i 30 "SPARGE_SM90_VARIANT=$v SPARGE_TRACE_STEADY=600 $B/trace 0.1 128 40 4"
    step ab_k64_d0098_v${v}_$i 30 "SPARGE_SM90_VARIANT=$v SPARGE_TRACE_STEADY=600 $B/trace 0.098 64 40 4"
  done
done
for v in 0 1048576; do step ab_k128_d04_v${v} 30 "SPARGE_SM90_VARIANT=$v SPARGE_TRACE_STEADY=200 $B/trace 0.4 128 40 4"; done
step suite 420 "$B/gpu --filter='^(?!BENCH)'"
{ cat $L/summary.txt; grep -E '^\[  (PASSED|FAILED)' $L/suite.log | head -40; tail -3 $L/suite.log
  for f in $L/ab_*.log; do echo "== $(basename $f)"; grep -E "ms \(median|digest" $f | head -4; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
