#!/usr/bin/env bash
# Session 13 round 7: dynamic tile scheduler (bit 16384): correctness (with the 3-CTA hook), A/B on causal dense and LUT rows.
TAG=s13r7; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
step t_dyn3 90 "SPARGE_SM90_VARIANT=16416 $B/new --filter='^(BSA|DENSE)(?!.*path=portable)' 2>&1 | grep -E 'seed =|PASSED|FAILED|Failure' | head -20"
step t_dynp 60 "SPARGE_SM90_VARIANT=16400 $B/new --filter='^(BSA|DENSE|SM90)(?!.*path=portable)' 2>&1 | grep -E 'seed =|PASSED|FAILED|Failure' | head -20"
step t_def 60 "$B/new --filter='^(BSA|DENSE|SM90)(?!.*path=portable)' 2>&1 | grep -E 'seed =|PASSED|FAILED|Failure' | head -20"
for i in 1 2; do for v in 0 16 16400 16384; do
  echo "== v=$v #$i" >> $L/bench.txt
  step b_${v}_$i 40 "SPARGE_SM90_VARIANT=$v SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH' | grep -vE 'portable   *[0-9.]+ TFLOPS   sm90 +0' >> $L/bench.txt"
done; done
cat $L/summary.txt; cat $L/t_*.log; cat $L/bench.txt | sed -E 's/portable +[0-9.]+ TFLOPS +//'
rm -f $L/b_*.log
