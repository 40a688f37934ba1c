#!/usr/bin/env bash
# Session 12 round 7: ws the default at hd64 too; hd64 + hd128 perf (r6 vs new); gather suite; ws hd64 relaunch/memcheck.
TAG=s12r7; BUDGET=${BUDGET:-260}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack r6 $B/r6
T=$B/new; O=$B/r6
step perf 70 "for x in $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF_HD64|GATHER_GPU_KV_PERF\\(' 2>&1 | grep -E 'perf\]' | grep -E 'hd64|lists=per-kv-head group_union=1 path=default (overlap=off union_variant=5|check_lists=0)' | sed -E 's/keys=2048 lists=per-kv-head group_union=1 //; s/union overlap.*//' | cut -c1-200; done"
step suite 120 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'gather profile|perf\]'"
step memcheck 40 "compute-sanitizer --tool memcheck --error-exitcode 9 $T --filter='GATHER_GPU\(b=1,hq=4,hk=4|GATHER_GPU_KV\(b=1,hq=4|UNCHECKED_BADLIST\(what=dup' > $L/mc.full 2>&1; echo rc=\$?; tail -3 $L/mc.full"
cat $L/summary.txt; cat $L/perf.log; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -8; grep -B2 -A10 'Failure' $L/suite.log | head -30; cat $L/memcheck.log
