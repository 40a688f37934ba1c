#!/usr/bin/env bash
# Session 12 round 6: one scratch allocation in gather; hd64 perf rows (default wgmma vs ws); r5 vs new perf; gather suite.
TAG=s12r6; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack r5 $B/r5
T=$B/new; O=$B/r5
step perf 60 "for x in $O $T $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF\\(' 2>&1 | grep -E 'lists=per-kv-head group_union=1 path=default (overlap=off union_variant=5|check_lists=0)' | sed -E 's/.*path=default/path=default/' | cut -c1-200; done"
step hd64 60 "$T --filter='GATHER_GPU_KV_PERF_HD64' 2>&1 | grep -E 'perf\]|gather profile|FAIL|PASSED'"
step suite 120 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'gather profile|perf\]'"
cat $L/summary.txt; cat $L/perf.log; cat $L/hd64.log | cut -c1-250; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -8; grep -B2 -A10 'Failure' $L/suite.log | head -30
