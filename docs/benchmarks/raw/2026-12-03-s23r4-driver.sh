#!/usr/bin/env bash
# Session 23 round 4 (final): Traits::kQRegs on in the hd128 BLKQ-128 128-key-stage kernels (128 x 128 and paired
# 128 x 64 LUTs): the GPU suite, compare.py (as s22r3), then memcheck of small cases on those kernels.
TAG=s23r4; BUDGET=${BUDGET:-540}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step suite 330 "$B/gpu --filter='^(?!BENCH)'"
wait $PB
step compare 200 "cd .. && python3 bench/compare.py --d 128,64 --topk 0.4,0.1 --pv-ab --fp8 --ab 20 --out $L --tag s23r4"
step memcheck 60 "compute-sanitizer --tool memcheck --error-exitcode 99 $B/gpu --filter='BSA.*sq=113.*d=128,blkq=128' 2>&1 | tail -4"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E '^\[  (PASSED|FAILED)' $L/suite.log | head -30; cat $L/memcheck.log
  sed -n '/^Targets/,$p' $L/compare.log | grep -E "d128 non-causal|A/B x20:"; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
