#!/usr/bin/env bash
# Session 22 round 1: the GPU suite with Traits::kRowStaggerOn = true (LUT tiles; the dense 176 tile excluded by
# the rule), then the stagger A/B on the dense-only 176 tile (mode 4 off / 6 on, no stamps) and on the LUT 128 tile
# at density 0.4 (mode 6 = off now that the default is on, 4 = on), alternating.
TAG=s22r1; BUDGET=${BUDGET:-545}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu; unpack trace $B/trace
for rep in 1 2 3; do for m in 4 6; do step d176_m${m}_r$rep 30 "$B/trace 1.0 176 20 $m"; done; done
for rep in 1 2; do for m in 4 6; do step l128_m${m}_r$rep 30 "$B/trace 0.4 128 20 $m"; done; done
step suite 420 "$B/gpu --filter='^(?!BENCH)'"
{ cat $L/summary.txt; for f in $L/d176_*.log $L/l128_*.log; do echo "== $(basename $f) $(grep -iE 'ms|tflops' $f | head -3 | tr '\n' ' ')"; done
  grep -E '^\[  (PASSED|FAILED|SKIPPED)|FAILED' $L/suite.log | head -30; tail -3 $L/suite.log; } > $L/all.txt
cat $L/all.txt
