#!/usr/bin/env bash
# Session 24 round 3: compare.py at HEAD's kernels with the kernel-vs-FlexAttention pairs on both block shapes (128 x 128
# as before, and 128 x 64, sparge's default map) and the token section; the Python extension built here first.
TAG=s24r3; BUDGET=${BUDGET:-480}; source "$(dirname "$0")/common.sh"
step pybuild 300 "cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q ."
step compare 240 "cd .. && python3 bench/compare.py --d 128 --causal no --topk 0.4,0.1 --pv-ab --fp8 --ab 20 --flex-blk 128,128x64 --token --out $L --tag s24r3"
{ cat $L/summary.txt; tail -3 $L/pybuild.log; sed -n '/^Targets/,$p' $L/compare.log; grep -E "A/B x20:|FlexAttention|n/a" $L/compare.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
