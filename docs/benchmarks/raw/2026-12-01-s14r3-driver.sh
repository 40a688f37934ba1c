#!/usr/bin/env bash
# Session 14 round 3: the split tail on LUT kernels. Correctness (sm90 path: BSA/DENSE/SM90 defaults, BSA under
# the split hook), memcheck on the split cases, then BENCH: old (round-1 binary: dense split only) vs new 0 / 16384.
TAG=s14r3; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack old $B/old
F='PASSED|FAILED|Failure|Expected|Which is|split vs|differs'
step sm90 200 "$B/new --filter='^(BSA|DENSE|SM90)(?!.*path=portable)' 2>&1 | grep -E '$F' | head -40"
step bsa_split 120 "SPARGE_SM90_VARIANT=32768 $B/new --filter='^BSA\((?!.*path=portable)(?!.*v=)' 2>&1 | grep -E '$F' | head -20"
step memcheck 120 "compute-sanitizer --tool memcheck --error-exitcode 9 $B/new --filter='^BSA(\(.*v=3|_SPLIT)(?!.*path=portable)' 2>&1 | grep -E 'ERROR SUMMARY|PASSED|FAILED|Invalid' | head"
for i in 1 2; do
  for v in old:0 new:0 new:16384; do
    b=${v%%:*}; vv=${v##*:}
    echo "== $b v=$vv #$i" >> $L/bench.txt
    step bench_${b}_${vv}_$i 50 "SPARGE_SM90_VARIANT=$vv SPARGE_BENCH=1 $B/$b --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH' >> $L/bench.txt"
  done
done
{ cat $L/summary.txt; for s in sm90 bsa_split memcheck; do echo "== $s"; cat $L/$s.log; done; cat $L/bench.txt; } > $L/all.txt
cat $L/all.txt
