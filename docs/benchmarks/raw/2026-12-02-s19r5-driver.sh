#!/usr/bin/env bash
# Session 19 round 5: Traits::kMaxSlack 8 shipped: whole GPU suite (not the BENCH rows) incl. the new q x 20 cases,
# BENCH rows, then compare.py (time-based warm-up and settle) with d 128, fp8, the A/B pairs.
TAG=s19r5; BUDGET=${BUDGET:-570}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step suite 400 "$B/new --filter='^(?!BENCH)' 2>&1 | tail -40"
wait $PB
step bench 60 "SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
step compare 200 "cd .. && python3 bench/compare.py --d 128 --topk 0.4,0.1 --pv-ab --fp8 --ab 20 --out $L --tag s19r5"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E "FAILED|Failure|PASSED  \]|SKIPPED \]" $L/suite.log | head -30;
  grep -E "dense|density=0.40 |density=0.10 |skewed:" $L/bench.log | sed 's/portable *[0-9.]* TFLOPS//; s/(x[0-9.]*)//' | tr -s ' ';
  sed -n '/^Targets/,$p' $L/compare.log; } > $L/all.txt
cat $L/all.txt
