#!/usr/bin/env bash
# Session 11 round 5 (#5): tree max / sum in the gather softmax (all gather kernels); ws DescBase + staged
# epilogue (r4). Suite, perf r4 vs new (all rows with profile lines), memcheck + racecheck on a ws case.
TAG=s11r5; BUDGET=${BUDGET:-420}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack sparge_gpu_tests $B/new; unpack r4_tests $B/r4
T=$B/new; O=$B/r4
F='GATHER_GPU_KV.b=1,hq=16,hk=4,sq=130'
step perf 90 "for r in 1 2; do for x in $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\]|gather profile|FAIL'; done; done"
step suite 200 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'perf\]|gather profile' "
step memcheck 60 "compute-sanitizer --tool memcheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -4"
step racecheck 150 "compute-sanitizer --tool racecheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -4"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -20; grep -B2 -A10 'Failure' $L/suite.log | head -60
cat $L/memcheck.log $L/racecheck.log
