#!/usr/bin/env bash
# Session 20 round 11: Traits::kRowStagger (the second row's max reduction made to wait for the first row's first
# exponential, so ptxas interleaves it with the first row's MUFUs) against the shipped softmax, modes 0 / 2 alternating.
TAG=s20r11; BUDGET=${BUDGET:-150}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
for rep in 1 2; do for d in 0.4 1.0 0.1; do for m in 0 2; do
  step t128_${d}_m${m}_r$rep 30 "$B/trace $d 128 30 $m | grep ^blk"
done; done; done
for m in 1 3; do step loop_m$m 30 "$B/trace 0.4 128 10 $m"; done
{ cat $L/summary.txt; for f in $L/t*.log; do echo "$(basename $f .log): $(cat $f)"; done;
  for f in $L/loop_*.log; do echo "== $(basename $f)"; grep -E "^blk|key tile 3" $f | sed 's/.*median cycles: //'; done; } > $L/all.txt
cat $L/all.txt
