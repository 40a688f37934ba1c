#!/usr/bin/env bash
# Session 22 round 2: Traits::kSplitQk (QK^T as two 64-key commit groups, the first half's row maxima taken before
# the second group's wait) A/B in the trace harness, stagger on in both: mode 4 (off) vs 12 (on), no stamps,
# alternating, at LUT density 0.4 / 1.0 / 0.1; the loop stamps (mode 1 vs 9) once at 0.4; the dense 176 stagger
# A/B again (4 off / 6 on).
TAG=s22r2; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
for rep in 1 2 3; do for m in 4 12; do step l04_m${m}_r$rep 30 "$B/trace 0.4 128 30 $m"; done; done
for rep in 1 2; do for m in 4 12; do step l10_m${m}_r$rep 30 "$B/trace 1.0 128 20 $m"; done; done
for rep in 1 2; do for m in 4 12; do step l01_m${m}_r$rep 30 "$B/trace 0.1 128 40 $m"; done; done
for m in 1 9; do step loop_m${m} 40 "$B/trace 0.4 128 10 $m"; done
for rep in 1 2; do for m in 4 6; do step d176_m${m}_r$rep 30 "$B/trace 1.0 176 20 $m"; done; done
{ cat $L/summary.txt; for f in $L/l0*.log $L/l1*.log $L/d176*.log; do echo "== $(basename $f) $(grep -E ' ms ' $f | head -1)"; done
  for f in $L/loop_*.log; do echo "== $(basename $f)"; grep -E "^blk|key tile|median" $f | head -30; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
