#!/usr/bin/env bash
# Session 20 round 6: softmax turns (SPARGE_SM90_VARIANT bit 1048576): the bitwise cases, alternating timings against
# the default (trace harness, 128x128 and paired 128x64 LUTs; loop intervals), then the BSA / DENSE cases under the bit.
TAG=s20r6; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
unpack trace $B/trace
step xu_cases 90 "$B/new --filter='SM90_XU_TURN' 2>&1 | tail -20"
for rep in 1 2 3; do for d in 0.4 0.1 1.0; do for v in 0 1048576; do
  step t128_${d}_v${v}_r$rep 30 "SPARGE_SM90_VARIANT=$v $B/trace $d 128 30 0 | grep ^blk"
done; done; done
for rep in 1 2; do for d in 0.4 0.1; do for v in 0 1048576; do
  step t64_${d}_v${v}_r$rep 30 "SPARGE_SM90_VARIANT=$v $B/trace $d 64 30 0 | grep ^blk"
done; done; done
for v in 0 1048576; do step loop_v$v 30 "SPARGE_SM90_VARIANT=$v $B/trace 0.4 128 10 1"; done
step attn_under_bit 240 "SPARGE_SM90_VARIANT=1048576 $B/new --filter='^(BSA|DENSE)(?!.*BENCH)' 2>&1 | tail -12"
{ cat $L/summary.txt; grep -E "FAILED|tests ran|PASSED  \]" $L/xu_cases.log $L/attn_under_bit.log;
  for f in $L/t*.log; do echo "$(basename $f .log): $(cat $f)"; done;
  for f in $L/loop_*.log; do echo "== $(basename $f)"; grep -E "^blk|key tile 3|per key tile|tile - n" $f; done; } > $L/all.txt
cat $L/all.txt
