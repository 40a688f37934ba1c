#!/usr/bin/env bash
# Session 11 round 10: union kernel phase A without per-entry branches (whole batches test only the range;
# unconditional atomicOr with a 0 bit for skipped entries; flags once per batch). Perf r7 vs new, suite.
TAG=s11r10; BUDGET=${BUDGET:-250}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack sparge_gpu_tests $B/new; unpack r7_tests $B/r7
T=$B/new; O=$B/r7
step perf 50 "for x in $O $T $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\]|gather profile|FAIL' | grep -E 'union_variant=5|gather profile|FAIL'; done"
step suite 150 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'perf\]|gather profile' "
step memcheck 30 "compute-sanitizer --tool memcheck --error-exitcode 9 $T --filter='GATHER_GPU_WS_SMALL|GATHER_GPU_BADLIST' > $L/mc.full 2>&1; echo rc=\$?; tail -3 $L/mc.full"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -8; grep -B2 -A10 'Failure' $L/suite.log | head -40; cat $L/memcheck.log
grep -E '^==|gather profile' $L/perf.log | grep -E '^==|kv-head' | sed -E 's/.*union ([0-9.]+ ms).*attention ([0-9.]+ ms).*/union \1 attention \2/' | head -40
grep -E '^==|lists=per-kv-head group_union=1 path=default overlap=off' $L/perf.log | sed -E 's/.*median/median/' | cut -c1-60
