#!/usr/bin/env bash
# Session 11 round 1 (#5): gather softmax as ex2.approx.ftz(fma) in every gather kernel; ws the default
# (hd128, >= 128-row groups, sm_90); opt-in paired ws consumers (SPARGE_GATHER_WS_PAIR=1).
TAG=s11r1; BUDGET=${BUDGET:-420}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack sparge_gpu_tests $B/new; unpack old_tests $B/old
T=$B/new; O=$B/old
step perf 90 "for r in 1 2; do for x in $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\]|gather profile|FAIL' | head -60; done; done"
step suite 280 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'perf\]|gather profile' "
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -20; grep -B2 -A10 'Failure' $L/suite.log | head -60
grep -E '^==|perf\]' $L/perf.log | sed -E 's/union overlap.*max/max/' | cut -c1-230
