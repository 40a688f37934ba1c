#!/usr/bin/env bash
# Session 25 round 4: the half-tile build (new: half tile on, and its loop as a lambda with the half tile's copy after it)
# against HEAD's build (old) in the trace harness, alternating binaries, back to back (mode 4): paired 128 x 64 at 25
# blocks per row (odd: every row ends with a half tile), 26 and 102 (even: no half tile; what the restructured loop costs
# by itself), and the unpaired 128 x 128 at 13 (the loop restructured, no half tile).
TAG=s25r4; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/new
unpack trace_old $B/old
for i in 1 2 3; do
  for bin in old new; do
    step ${bin}_k64_d0098_$i 30 "SPARGE_TRACE_STEADY=600 $B/$bin 0.098 64 40 4"
    step ${bin}_k64_d0102_$i 30 "SPARGE_TRACE_STEADY=600 $B/$bin 0.102 64 40 4"
    step ${bin}_k64_d0398_$i 30 "SPARGE_TRACE_STEADY=200 $B/$bin 0.398 64 40 4"
    step ${bin}_k128_d01_$i 30 "SPARGE_TRACE_STEADY=600 $B/$bin 0.1 128 40 4"
  done
done
{ cat $L/summary.txt; for f in $L/*_k*.log; do echo "$(basename $f .log): $(grep -E 'ms \(median' $f | sed 's/.*variant [0-9]*: //; s/ (median.*//') $(grep -o 'digest [0-9a-f]*' $f)"; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
