#!/usr/bin/env bash
# Session 22 round 4: Traits::kDoubleP (two P buffers; row r's P packed inside the softmax right after its
# exponentials, so the packs fill the other row's MUFU gaps and only the O rescale follows the PV wait) A/B in the
# trace harness: mode 4 (off) vs 12 (on), no stamps, alternating, at LUT density 0.4 / 1.0 / 0.1; loop stamps
# mode 1 vs 9 at 0.4.
TAG=s22r4; BUDGET=${BUDGET:-150}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
for rep in 1 2 3; do for m in 4 12; do step l04_m${m}_r$rep 30 "$B/trace 0.4 128 30 $m"; done; done
for rep in 1 2; do for m in 4 12; do step l10_m${m}_r$rep 30 "$B/trace 1.0 128 20 $m"; done; done
for rep in 1 2; do for m in 4 12; do step l01_m${m}_r$rep 30 "$B/trace 0.1 128 40 $m"; done; done
for m in 1 9; do step loop_m${m} 40 "$B/trace 0.4 128 10 $m"; done
{ cat $L/summary.txt; for f in $L/l0*.log $L/l1*.log; do echo "== $(basename $f) $(grep -E ' ms ' $f | head -1)"; done
  for f in $L/loop_*.log; do echo "== $(basename $f)"; grep -E "^blk|key tile|median" $f | head -30; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
