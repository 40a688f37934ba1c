#!/usr/bin/env bash
# Session 23 round 3: Traits::kQRegs (Q held in registers, QK^T with A from registers) A/B in the trace harness,
# mode 4 (shipped) vs 12 (Q in registers), alternating, LUT 128x128 b2 h32 s16384: single launches and back to back
# (SPARGE_TRACE_STEADY), density 0.4 / 0.1 / 1.0; O digests compared.
TAG=s23r3; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
for rep in 1 2 3; do for m in 4 12; do step l04_m${m}_r$rep 20 "SPARGE_TRACE_STEADY=150 $B/trace 0.4 128 20 $m"; done; done
for rep in 1 2 3; do for m in 4 12; do step l01_m${m}_r$rep 20 "SPARGE_TRACE_STEADY=600 $B/trace 0.1 128 40 $m"; done; done
for rep in 1 2; do for m in 4 12; do step l10_m${m}_r$rep 20 "SPARGE_TRACE_STEADY=60 $B/trace 1.0 128 10 $m"; done; done
{ cat $L/summary.txt; for f in $L/l*.log; do echo "== $(basename $f)"; grep -E " ms |steady|digest" $f; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
