#!/usr/bin/env bash
# Session 10 round 10 (#5): ws the default attention at hd128 for groups >= 128 rows on sm_90 (its consumers without
# per-element mask tests when a warp's masks are all ones, and without unneeded O rescales; the other kernels' SASS is
# unchanged). GATHER/COMPACT/TOPK suites; memcheck + racecheck on one kv case; GATHER_GPU_KV_PERF r7 vs new.
TAG=s10r10; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B/bin $B/tests
xz -dc bins/sparge_gpu_tests.xz > $B/tests/sparge_gpu_tests; xz -dc bins/sparge_gpu_tests_r7.xz > $B/tests/old_tests
chmod +x $B/tests/sparge_gpu_tests $B/tests/old_tests
T=$B/tests/sparge_gpu_tests; O=$B/tests/old_tests
F='GATHER_GPU_KV.b=1,hq=16,hk=4,sq=130'
step suite 150 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'perf\]|gather profile' "
step perf 60 "for r in 1 2; do for x in $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\]|gather profile|FAIL' | head -40; done; done"
step memcheck 50 "compute-sanitizer --tool memcheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -4"
step racecheck 50 "compute-sanitizer --tool racecheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -4"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head; grep -B2 -A10 'Failure' $L/suite.log | head -30
cat $L/memcheck.log $L/racecheck.log
grep -E '^==|perf\]' $L/perf.log | cut -c1-200
(cd $OUT && tar czf $TAG.tar.gz r && rm -rf r)
