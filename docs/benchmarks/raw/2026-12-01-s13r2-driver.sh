#!/usr/bin/env bash
# Session 13 round 2: the 176 tile with K/V multicast (128), persistence (16), both (144); clocks and power.
TAG=s13r2; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
step dense_mc 60 "SPARGE_SM90_VARIANT=128 $B/new --filter='^DENSE(?!.*path=portable)' 2>&1 | grep -E 'PASSED|FAILED|Failure' | head"
step dense_mcp 60 "SPARGE_SM90_VARIANT=144 $B/new --filter='^DENSE(?!.*path=portable)' 2>&1 | grep -E 'PASSED|FAILED|Failure' | head"
step dense_mcp3 60 "SPARGE_SM90_VARIANT=176 $B/new --filter='^DENSE(?!.*path=portable)' 2>&1 | grep -E 'PASSED|FAILED|Failure' | head"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 200 > $L/smi.log 2>&1 &
SMI=$!
for i in 1 2; do
  for v in 0 128 16 144 4096; do
    echo "$(date +%T.%N | cut -c1-12) start v=$v" >> $L/marks.log
    step bench_v${v}_$i 60 "SPARGE_SM90_VARIANT=$v SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH dense '"
  done
done
echo "$(date +%T.%N | cut -c1-12) start cudnn" >> $L/marks.log
step cudnn 60 "python3 drv/cudnn.py"
echo "$(date +%T.%N | cut -c1-12) end" >> $L/marks.log
kill $SMI
cat $L/summary.txt; for f in $L/dense_*.log; do echo "== $f"; cat $f; done
for i in 1 2; do for v in 0 128 16 144 4096; do echo "== v=$v #$i"; cat $L/bench_v${v}_$i.log; done; done; cat $L/cudnn.log
