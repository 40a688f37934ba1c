#!/usr/bin/env bash
# Session 14 round 2: BENCH full rows, default vs no persistence (64) for the LUT rows; then compare.py (all dims, fp8, pv A/B, token).
TAG=s14r2; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
for i in 1 2; do for v in 0 64; do
  echo "== v=$v #$i" >> $L/bench.txt
  step bench_${v}_$i 60 "SPARGE_SM90_VARIANT=$v SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH' >> $L/bench.txt"
done; done
wait $PB
step compare 300 "cd .. && python3 bench/compare.py --fp8 --pv-ab --token --out $L --tag s14r2"
{ cat $L/summary.txt; tail -3 $L/pybuild.log; cat $L/bench.txt; grep -E "^==|cuDNN SDPA  |sparge dense  |FlexAttention 128|sparge kernel 128x128|sparge_attn|FAIL|PASS|gather|topk_select" $L/compare.log | head -90; } > $L/all.txt
cat $L/all.txt
