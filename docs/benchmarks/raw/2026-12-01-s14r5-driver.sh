#!/usr/bin/env bash
# Session 14 round 5: A/B of the pingpong handover: exp = turn handed to the other warpgroup right after QK^T is
# issued (before PV), new = after PV (the default). Correctness of exp on the sm90 path, then BENCH x3 interleaved.
TAG=s14r5; BUDGET=${BUDGET:-400}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack exp $B/exp
F='PASSED|FAILED|Failure'
step exp_sm90 120 "$B/exp --filter='^(BSA|DENSE|SM90)(?!.*path=portable)' 2>&1 | grep -E '$F' | head -20"
for i in 1 2 3; do for b in new exp; do
  echo "== $b #$i" >> $L/bench.txt
  step bench_${b}_$i 50 "SPARGE_BENCH=1 $B/$b --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH' >> $L/bench.txt"
done; done
{ cat $L/summary.txt; cat $L/exp_sm90.log; cat $L/bench.txt; } > $L/all.txt
cat $L/all.txt
