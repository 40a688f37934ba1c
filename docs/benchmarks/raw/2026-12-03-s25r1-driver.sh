#!/usr/bin/env bash
# Session 25 round 1: compare.py at HEAD (its A/B now reports the per-block-pair ratio spread), 40 A/B rounds, topk 0.4 /
# 0.1 / 1.0 (1.0: the kernels' own dense rates on a full LUT, fp8 included), both FlexAttention block shapes, token section.
TAG=s25r1; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
step pybuild 300 "cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q ."
step compare 250 "cd .. && python3 bench/compare.py --d 128 --causal no --topk 0.4,0.1,1.0 --pv-ab --fp8 --ab 40 --flex-blk 128,128x64 --token --out $L --tag s25r1"
{ cat $L/summary.txt; cat $L/machine.txt; tail -3 $L/pybuild.log; sed -n '/^Targets/,$p' $L/compare.log; grep -E "A/B x40:|FlexAttention|n/a" $L/compare.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
