#!/usr/bin/env bash
# Session 22 round 6 (prepared, not run: no device time left). Why sparge dense at compare.py's gather shape
# (b1 hq32 hk8 sq1024 sk16384 d128) ran 621.8 TFLOPS in s22r5 against 680.4 in s15r7 while b2 h32 s16384 stayed
# at ~624: the dense-only 176 tile at that shape (NHD here; compare.py uses HND) with the row stagger on (HEAD's
# default, trace mode 4) and off (mode 6), and with the launch features that depend on the tile count turned off one
# at a time through SPARGE_SM90_VARIANT (8192 no K/V multicast, 16384 no split tail, 64 not persistent),
# alternating; then b2 h32 s16384 on / off. Needs build-dev/pack/trace.xz (sparge_sm90_trace) and common.sh
# (raw/2026-12-01-s16-common.sh).
TAG=s22r6; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
G="SPARGE_TRACE_SHAPE=1,32,8,1024,16384"
for rep in 1 2 3; do
  for m in 4 6; do step g_m${m}_r$rep 20 "$G $B/trace 1.0 176 100 $m"; done
  for v in 8192 16384 64; do step g_v${v}_r$rep 20 "$G SPARGE_SM90_VARIANT=$v $B/trace 1.0 176 100 4"; done
done
for rep in 1 2; do for m in 4 6; do step d_m${m}_r$rep 30 "$B/trace 1.0 176 20 $m"; done; done
{ cat $L/summary.txt; for f in $L/g_*.log $L/d_*.log; do echo "== $(basename $f) $(grep -E ' ms ' $f | head -1)"; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
