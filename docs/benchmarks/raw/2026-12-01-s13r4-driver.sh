#!/usr/bin/env bash
# Session 13 round 4: python extension, compare.py (peers in one process), BENCH A/B of bit 1024 on the 176 tile.
TAG=s13r4; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
for i in 1 2; do
  step bench_v0_$i 40 "SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH dense '"
  step bench_v1024_$i 40 "SPARGE_SM90_VARIANT=1024 SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH dense '"
done
step pybuild 240 "cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q ."
step compare 330 "cd .. && python3 bench/compare.py --fp8 --pv-ab --out $L --tag s13r4"
cat $L/summary.txt
for f in $L/bench_*.log; do echo "== $f"; cat $f; done
grep -E "^==|cuDNN SDPA  |sparge dense  |FAIL|PASS" $L/compare.log | head -60
cat $L/bench_*.log > $L/bench.txt; rm -f $L/bench_*.log
