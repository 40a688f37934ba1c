#!/usr/bin/env bash
# Session 25 round 5: the trace harness's new fp8 mode (SPARGE_TRACE_FP8=1: the fp8 recipe's kernel alone on random e4m3
# inputs) at density 0.1 with stamps and back to back, at 1.0 back to back; the fp16 128 x 128 kernel stamped alongside.
TAG=s25r5; BUDGET=${BUDGET:-70}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
step f8_k128_d01_m0 20 "SPARGE_TRACE_FP8=1 $B/trace 0.1 128 20 0"
step f16_k128_d01_m0 20 "$B/trace 0.1 128 20 0"
step f8_k128_d01_m4 20 "SPARGE_TRACE_FP8=1 SPARGE_TRACE_STEADY=300 $B/trace 0.1 128 20 4"
step f8_k128_d1_m4 20 "SPARGE_TRACE_FP8=1 SPARGE_TRACE_STEADY=30 $B/trace 1.0 128 10 4"
{ cat $L/summary.txt; for f in $L/f*.log; do echo "== $(basename $f)"; head -40 $f; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
