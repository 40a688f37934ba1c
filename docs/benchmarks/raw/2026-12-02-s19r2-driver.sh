#!/usr/bin/env bash
# Session 19 round 2: sparge_sm90_trace modes 0..5 (ex2_poly every 8th / 4th / 2nd score tile of unmasked tiles)
# at densities 0.1, 0.4, 1.0, twice (interleaved).
TAG=s19r2; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
for rep in 1 2; do for d in 0.1 0.4 1.0; do for m in 0 1 2 3 4 5; do
  step trace_${d}_${m}_$rep 40 "$B/trace $d 128 50 $m"
done; done; done
{ for f in $L/trace_*.log; do echo "$(basename $f .log) $(grep -E '^blk' $f | sed 's/.*variant 0: //')"; done;
  for f in $L/trace_*_1_1.log $L/trace_*_5_1.log; do echo "== $(basename $f)"; grep -E "key tile 3" $f; done; } > $L/all.txt
cat $L/all.txt
