#!/usr/bin/env bash
# Session 16 round 2: causal pairs for every BLKQ >= 128 dense tile (hd64 192 x 128, 128 x 128 with bit 4096);
# suite cases, A/B of SPARGE_BENCH=dense (now with a d=64 causal row), then compare.py with the acceptance pairs
# also timed in alternation (--ab 20).
TAG=s16r2; BUDGET=${BUDGET:-580}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step suite 150 "$B/new --filter='DENSE|SPLIT|PERSISTENT|causal=1'"
step sanitize 60 "compute-sanitizer --tool memcheck --error-exitcode 99 $B/new --filter='DENSE_CAUSAL_PAIRS' 2>&1 | tail -4"
wait $PB
for i in 1 2 3; do
  for v in 0 131072; do
    step ab_${v}_$i 60 "SPARGE_BENCH=dense SPARGE_SM90_VARIANT=$v $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
  done
done
step compare 330 "cd .. && python3 bench/compare.py --d 128,64 --topk 0.4,0.1 --pv-ab --ab 20 --out $L --tag s16r2"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E "FAILED|Failure" $L/suite.log | head -20; grep -E "tests ran|PASSED  \]|SKIPPED \]" $L/suite.log; cat $L/sanitize.log; for f in $L/ab_*.log; do echo "$(basename $f): $(grep -E 'dense' $f | sed 's/portable 0.0 TFLOPS//; s/(x0.00)//' | tr -s ' ' | tr '\n' ' ')"; done; sed -n '/^Targets/,$p' $L/compare.log; grep -E "A/B x" $L/compare.log; } > $L/all.txt
cat $L/all.txt
