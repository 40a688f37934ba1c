#!/usr/bin/env bash
# Session 22 round 3 (final): the GPU suite with Traits::kRowStagger on in every fp16 / bf16 kernel (the dense 176
# tile included), a memcheck of small cases, the BENCH rows, then compare.py (d 128 and 64, topk 0.4 / 0.1,
# pv A/B, fp8, acceptance pairs in alternation).
TAG=s22r3; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step suite 400 "$B/gpu --filter='^(?!BENCH)'"
step memcheck 90 "compute-sanitizer --tool memcheck --error-exitcode 99 $B/gpu --filter='sq=113|sq=203|r=7|n=1000' 2>&1 | tail -4"
step bench 60 "SPARGE_BENCH=1 $B/gpu --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
wait $PB
step compare 300 "cd .. && python3 bench/compare.py --d 128,64 --topk 0.4,0.1 --pv-ab --fp8 --ab 20 --out $L --tag s22r3"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E '^\[  (PASSED|FAILED)' $L/suite.log | head -30; cat $L/memcheck.log
  grep -E "dense|density=0.40 |density=0.10 |skewed:" $L/bench.log | grep -v "pv=on" | tr -s ' '
  sed -n '/^Targets/,$p' $L/compare.log; grep -E "A/B x" $L/compare.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
