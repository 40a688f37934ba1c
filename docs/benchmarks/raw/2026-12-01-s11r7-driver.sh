#!/usr/bin/env bash
# Session 11 round 7 (final for #5): the new ws tests (400 relaunches, small 160-row group), sanitizers on the
# small case (memcheck, racecheck, synccheck), GATHER|COMPACT|TOPK, KV perf (r6 vs new binary: same kernels).
TAG=s11r7; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack sparge_gpu_tests $B/new; unpack r6_tests $B/r6
T=$B/new; O=$B/r6
F='GATHER_GPU_WS_SMALL'
step ws 60 "$T --filter='GATHER_GPU_WS' 2>&1 | grep -vE '^\[ RUN'"
step memcheck 60 "compute-sanitizer --tool memcheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -3"
step racecheck 120 "compute-sanitizer --tool racecheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -3"
step synccheck 60 "compute-sanitizer --tool synccheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -3"
step perf 40 "for x in $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\]|gather profile|FAIL'; done"
step suite 150 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'perf\]|gather profile' "
cat $L/summary.txt; cat $L/ws.log | tail -12; cat $L/memcheck.log $L/racecheck.log $L/synccheck.log
grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -8; grep -B2 -A10 'Failure' $L/suite.log | head -40
