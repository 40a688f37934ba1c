#!/usr/bin/env bash
# Session 16 round 1: the causal pairs (suite cases + same-process-free A/B of SPARGE_BENCH=dense, default vs
# bit 131072, interleaved processes), the Python tests on CUDA (varlen fakes / compile, not yet run there),
# compare.py --varlen (never run on a GPU yet).
TAG=s16r1; BUDGET=${BUDGET:-570}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step suite 200 "$B/new --filter='DENSE|SPLIT|PERSISTENT|SM90|causal=1'"
step sanitize 90 "compute-sanitizer --tool memcheck --error-exitcode 99 $B/new --filter='DENSE_CAUSAL_PAIRS|DENSE_SPLIT_TAIL' 2>&1 | tail -5"
wait $PB
for i in 1 2 3; do
  for v in 0 131072; do
    step ab_${v}_$i 60 "SPARGE_BENCH=dense SPARGE_SM90_VARIANT=$v $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
  done
done
step pytest 120 "cd .. && python3 -m pytest -q python/tests 2>&1 | tail -15"
step varlen 90 "cd .. && python3 bench/compare.py --d '' --varlen --out $L --tag s16r1 2>&1 | tail -30"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E "FAILED|Failure" $L/suite.log | head -20; grep -E "tests ran|PASSED  \]|SKIPPED \]" $L/suite.log; cat $L/sanitize.log; for f in $L/ab_*.log; do echo "$(basename $f): $(grep -E 'dense causal|dense  ' $f | tr -s ' ' | tr '\n' ' ')"; done; cat $L/pytest.log; cat $L/varlen.log; } > $L/all.txt
cat $L/all.txt
