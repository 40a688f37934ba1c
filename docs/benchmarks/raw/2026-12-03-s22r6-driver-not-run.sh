#!/usr/bin/env bash
# Session 22 round 6: the dense 176 tile at compare.py's gather shape (b1 hq32 hk8 sq1024 sk16384 d128; NHD here)
# with the row stagger (HEAD's default, trace mode 4) and without it (mode 6), alternating; then b2 h32 s16384.
TAG=s22r6; BUDGET=${BUDGET:-120}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
for rep in 1 2 3 4; do for m in 4 6; do step g_m${m}_r$rep 20 "SPARGE_TRACE_SHAPE=1,32,8,1024,16384 $B/trace 1.0 176 100 $m"; done; done
for rep in 1 2; do for m in 4 6; do step d_m${m}_r$rep 30 "$B/trace 1.0 176 20 $m"; done; done
{ cat $L/summary.txt; for f in $L/g_*.log $L/d_*.log; do echo "== $(basename $f) $(grep -E ' ms ' $f | head -1)"; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
