#!/usr/bin/env bash
# Session 20 round 9 (probe): the key-tile intervals with the previous PV issued after the softmax (no PV of the
# warpgroup in flight during its softmax; Traits::kProbePvAfter, trace mode 3) against the shipped order (mode 1).
TAG=s20r9; BUDGET=${BUDGET:-120}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
for rep in 1 2; do for m in 1 3; do step loop_m${m}_r$rep 30 "$B/trace 0.4 128 10 $m"; done; done
{ cat $L/summary.txt; for f in $L/loop_*.log; do echo "== $(basename $f)"; grep -E "^blk|key tile 3" $f | sed 's/.*median cycles: //'; done; } > $L/all.txt
cat $L/all.txt
