#!/usr/bin/env bash
# Session 20 round 2: the early pingpong turn (SPARGE_SM90_VARIANT bit 1048576): correctness (the new bitwise cases,
# the attention cases under the bit) and same-process-alternating A/B timings against the default.
TAG=s20r2; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
unpack trace $B/trace
unpack cli $B/cli
step early_cases 60 "$B/new --filter='SM90_EARLY_TURN' 2>&1 | tail -15"
for rep in 1 2 3; do
  for v in 0 1048576; do
    step bench_r${rep}_v$v 60 "SPARGE_SM90_VARIANT=$v $B/cli bench -topk=0.4 -repeat=20 -seed=5; SPARGE_SM90_VARIANT=$v $B/cli bench -topk=0.1 -repeat=20 -seed=5; SPARGE_SM90_VARIANT=$v $B/cli bench -topk=0.4 -blkk=128 -repeat=20 -seed=5"
  done
done
for v in 0 1048576; do
  step trace_v$v 40 "SPARGE_SM90_VARIANT=$v $B/trace 0.4 128 30 1; SPARGE_SM90_VARIANT=$v $B/trace 0.1 128 30 0"
done
step attn_under_bit 200 "SPARGE_SM90_VARIANT=1048576 $B/new --filter='AttentionGpu' 2>&1 | tail -8"
{ cat $L/summary.txt; grep -E "FAILED|tests ran|PASSED  \]" $L/early_cases.log $L/attn_under_bit.log;
  for f in $L/bench_*.log; do echo "== $(basename $f)"; grep -E "ms|TFLOPS" $f | head -20; done;
  for f in $L/trace_*.log; do echo "== $(basename $f)"; grep -E "^blk|key tile 3|per key tile" $f; done; } > $L/all.txt
cat $L/all.txt
