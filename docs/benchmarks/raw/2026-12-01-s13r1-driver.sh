#!/usr/bin/env bash
# Session 13 round 1: the dense 128 x 176 tile (hd128 non-causal): correctness and A/B against 128 x 128 (bit 4096), cuDNN.
TAG=s13r1; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
step dense 120 "$B/new --filter='^(DENSE|SM90)(?!.*path=portable)' 2>&1 | grep -vE '^\[ RUN|^\[       OK'"
for i in 1 2; do
  step bench176_$i 60 "SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep '^BENCH'"
  step bench128_$i 60 "SPARGE_SM90_VARIANT=4096 SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH dense '"
done
step cudnn 60 "python3 drv/cudnn.py"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/dense.log | head -12; grep -B2 -A12 'Failure' $L/dense.log | head -30
for f in $L/bench*.log $L/cudnn.log; do echo "== $f"; cat $f; done
