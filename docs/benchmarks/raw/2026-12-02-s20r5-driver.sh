#!/usr/bin/env bash
# Session 20 round 5 (diagnostic): every kernel of one sparge bench call (topk 0.1, 128x128, fp8 and fp16) with its
# duration under ncu, to find the fp8 path's density-independent ~0.5 ms.
TAG=s20r5; BUDGET=${BUDGET:-240}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack cli $B/cli
for r in fp8 none; do
  step ncu_$r 100 "ncu --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size $B/cli bench -topk=0.1 -blkk=128 -recipe=$r -warmup=1 -repeat=1 -seed=5 2>&1 | grep -E 'gpu__time_duration|launch__grid_size|launch__block_size|^  [a-zA-Z_].*\\(' "
done
{ cat $L/summary.txt; for f in $L/ncu_*.log; do echo "== $(basename $f)"; cat $f | paste - - - - | awk '{print}' | cut -c1-230; done; } > $L/all.txt
cat $L/all.txt
