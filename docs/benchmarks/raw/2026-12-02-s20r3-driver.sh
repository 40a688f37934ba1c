#!/usr/bin/env bash
# Session 20 round 3: Traits::kEarlyPack (P packed and O rescaled inside the exponentials) against the shipped
# loop, alternating in one process order: sparge_sm90_trace modes 0 / 2 (128x128 and paired 128x64), then the
# loop intervals (modes 1 / 3).
TAG=s20r3; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
for rep in 1 2 3; do for d in 0.4 0.1 1.0; do for m in 0 2; do
  step t128_${d}_m${m}_r$rep 30 "$B/trace $d 128 30 $m | head -2"
done; done; done
for rep in 1 2; do for d in 0.4 0.1; do for m in 0 2; do
  step t64_${d}_m${m}_r$rep 30 "$B/trace $d 64 30 $m | head -2"
done; done; done
for m in 1 3; do step loop_m$m 30 "$B/trace 0.4 128 10 $m"; done
{ cat $L/summary.txt; for f in $L/t*.log; do echo "$(basename $f .log): $(grep -E '^blk' $f)"; done;
  for f in $L/loop_*.log; do echo "== $(basename $f)"; grep -E "^blk|key tile 3|per key tile|tile - n" $f; done; } > $L/all.txt
cat $L/all.txt
