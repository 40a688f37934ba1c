#!/usr/bin/env bash
# Session 11 round 6: whole GPU suite (also covers d5bf357's FastDiv move, not run before), gather perf r5 vs new
# (func attributes cached per device; PDL rows), memcheck on a ws case.
TAG=s11r6; BUDGET=${BUDGET:-420}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack sparge_gpu_tests $B/new; unpack r5_tests $B/r5
T=$B/new; O=$B/r5
F='GATHER_GPU_KV.b=1,hq=16,hk=4,sq=130'
step perf 60 "for r in 1 2; do for x in $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\]|gather profile|FAIL'; done; done"
step memcheck 40 "compute-sanitizer --tool memcheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -3"
step gpu 300 "$T 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'perf\]|gather profile'"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/gpu.log | head -20; grep -B2 -A10 'Failure' $L/gpu.log | head -60
cat $L/memcheck.log
