#!/usr/bin/env bash
# Session 16 round 3: causal pairs for LUT launches (suite cases incl. BSA_CAUSAL_PAIRS, A/B of
# SPARGE_BENCH=causal_lut default vs bit 131072 in interleaved processes), compare.py d128 with the A/B in
# alternating blocks of 5 calls.
TAG=s16r3; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step suite 170 "$B/new --filter='BSA|DENSE|SPLIT|PERSISTENT|causal=1'"
step sanitize 60 "compute-sanitizer --tool memcheck --error-exitcode 99 $B/new --filter='CAUSAL_PAIRS' 2>&1 | tail -4"
wait $PB
for i in 1 2 3; do
  for v in 0 131072; do
    step ab_${v}_$i 60 "SPARGE_BENCH=causal_lut SPARGE_SM90_VARIANT=$v $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
  done
done
step compare 200 "cd .. && python3 bench/compare.py --d 128 --topk 0.4,0.1 --pv-ab --ab 20 --out $L --tag s16r3"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E "FAILED|Failure" $L/suite.log | head -20; grep -E "tests ran|PASSED  \]|SKIPPED \]" $L/suite.log; cat $L/sanitize.log; for f in $L/ab_*.log; do echo "$(basename $f): $(sed 's/portable *0.0 TFLOPS//; s/(x0.00)//; s/BENCH causal lut //' $f | tr -s ' ' | tr '\n' ' ')"; done; grep -E "^==|cuDNN SDPA  |sparge dense  |FlexAttention 128|sparge kernel 128x128|sparge_attn topk|A/B x" $L/compare.log; sed -n '/^Targets/,$p' $L/compare.log; } > $L/all.txt
cat $L/all.txt
