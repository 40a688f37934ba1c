#!/usr/bin/env bash
# Session 24 round 1: Traits::kRowSumMma (softmax denominators by mma.sync with an all-ones B) A/B in the trace
# harness, mode 4 (the build's default: on) vs 20 (off: the FADD chains), alternating, b2 h32 s16384, back to back
# (SPARGE_TRACE_STEADY); then the whole GPU suite with it on.
TAG=s24r1; BUDGET=${BUDGET:-570}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
unpack gpu $B/gpu
for rep in 1 2 3; do for m in 4 20; do step l04_m${m}_r$rep 20 "SPARGE_TRACE_STEADY=150 $B/trace 0.4 128 20 $m"; done; done
for rep in 1 2 3; do for m in 4 20; do step l01_m${m}_r$rep 20 "SPARGE_TRACE_STEADY=600 $B/trace 0.1 128 40 $m"; done; done
for rep in 1 2; do step l04_m6_r$rep 20 "SPARGE_TRACE_STEADY=150 $B/trace 0.4 128 20 6"; done
for rep in 1 2; do for m in 4 20; do step l10_m${m}_r$rep 20 "SPARGE_TRACE_STEADY=60 $B/trace 1.0 128 10 $m"; done; done
for rep in 1 2; do for m in 4 20; do step p04_m${m}_r$rep 20 "SPARGE_TRACE_STEADY=150 $B/trace 0.4 64 20 $m"; done; done
for rep in 1 2; do for m in 4 20; do step d176_m${m}_r$rep 20 "SPARGE_TRACE_STEADY=60 $B/trace 1.0 176 10 $m"; done; done
# The suite only when the row sums by mma.sync win back to back at density 0.4 (median of the three pairs).
win=$(for m in 4 20; do grep -h steady $L/l04_m${m}_r*.log | awk '{print $2}' | sort -n | sed -n 2p; done | paste -sd' ' | awk '{print ($1 < $2 * 0.997) ? 1 : 0}')
echo "win=$win" | tee -a $L/summary.txt
[ "$win" = 1 ] && step suite 420 "$B/gpu --filter='^(?!BENCH)'"
{ cat $L/summary.txt; for f in $L/[lpd]*.log; do echo "== $(basename $f)"; grep -E " ms |steady|digest" $f; done
  grep -E '^\[  (PASSED|FAILED)' $L/suite.log | head -40; tail -3 $L/suite.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
