#!/usr/bin/env bash
# Session 20 round 4 (diagnostic, shipped kernels): time per call against density for the fp16 and the fp8
# recipe (sparge bench, block map + kernel; 128x128 and 128x64), to fit time = a * density + b per path, and
# the trace harness's per-tile intervals at 0.05 / 0.1 / 0.2.
TAG=s20r4; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack cli $B/cli
unpack trace $B/trace
for bk in 128 64; do for r in none fp8; do for t in 0.05 0.1 0.2 0.4 0.8; do
  step b_${bk}_${r}_$t 40 "$B/cli bench -topk=$t -blkk=$bk -recipe=$r -repeat=15 -seed=5"
done; done; done
for d in 0.05 0.1 0.2; do step tr_$d 30 "$B/trace $d 128 20 0"; done
{ cat $L/summary.txt; for f in $L/b_*.log; do echo "$(basename $f .log): $(grep -E '^sparse attention|^sparse total|^block map  ' $f | awk '{printf "%s %s %s | ", $1, $2, $3}')"; done;
  for f in $L/tr_*.log; do echo "== $(basename $f)"; grep -E "^blk|per key tile|tile - n|first QK|last PV|epilogue" $f; done; } > $L/all.txt
cat $L/all.txt
