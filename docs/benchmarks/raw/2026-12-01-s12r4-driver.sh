#!/usr/bin/env bash
# Session 12 round 4: check_lists = false (unchecked bad lists, CUDA graph capture); gather suite; perf rows; memcheck.
TAG=s12r4; BUDGET=${BUDGET:-250}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
T=$B/new
step new 60 "$T --filter='GATHER_GPU_GRAPH|UNCHECKED' 2>&1 | grep -vE '^\[ RUN|^\[       OK'"
step suite 120 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'gather profile'"
step memcheck 40 "compute-sanitizer --tool memcheck --error-exitcode 9 $T --filter='UNCHECKED|GATHER_GPU_GRAPH' > $L/mc.full 2>&1; echo rc=\$?; tail -3 $L/mc.full"
cat $L/summary.txt; tail -5 $L/new.log; grep -B2 -A12 'Failure' $L/new.log | head -40; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -8; grep -B2 -A10 'Failure' $L/suite.log | head -30; cat $L/memcheck.log
grep -E 'lists=per-kv-head group_union=1 path=default (check_lists=0|overlap=off union_variant=5)' $L/suite.log | sed -E 's/.*(path=default[^:]*): median/\1: median/' | cut -c1-220
