#!/usr/bin/env bash
# Session 26 round 1: the fp8 trace (s25r5's steps) and the BLKQ-64 kernel (two CTAs per SM) against BLKQ 128 on
# sparge bench's own maps at topk 0.1 / 0.4 (useful TFLOPS of the sparse attention, and the full-LUT row).
TAG=s26r1; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
unpack cli $B/sparge
step f8_k128_d01_m0 20 "SPARGE_TRACE_FP8=1 $B/trace 0.1 128 20 0"
step f16_k128_d01_m0 20 "$B/trace 0.1 128 20 0"
step f8_k128_d01_m4 20 "SPARGE_TRACE_FP8=1 SPARGE_TRACE_STEADY=300 $B/trace 0.1 128 20 4"
step f8_k128_d1_m4 20 "SPARGE_TRACE_FP8=1 SPARGE_TRACE_STEADY=30 $B/trace 1.0 128 10 4"
for t in 0.1 0.4; do for kk in 128 64; do for q in 128 64; do
  step bench_t${t}_q${q}_k${kk} 25 "$B/sparge bench -seed=7 -repeat=30 -topk=$t -blkq=$q -blkk=$kk"
done; done; done
for t in 0.1 0.4; do for q in 64 128; do
  step benchR_t${t}_q${q}_k128 25 "$B/sparge bench -seed=7 -repeat=30 -topk=$t -blkq=$q -blkk=128"
done; done
{ cat $L/summary.txt; for f in $L/f*.log; do echo "== $(basename $f)"; head -40 $f; done;
  for f in $L/bench*.log; do echo "== $(basename $f)"; grep -E "density|sparse attention|dense \(full" $f; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
