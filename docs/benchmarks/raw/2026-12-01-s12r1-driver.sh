#!/usr/bin/env bash
# Session 12 round 1: flags read-back forked (host waits on the union only); perf s11 vs new; gather suite; union ncu.
TAG=s12r1; BUDGET=${BUDGET:-280}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack s11 $B/s11
T=$B/new; O=$B/s11
step perf 70 "for x in $O $T $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\]|gather profile|FAIL' | grep -E 'union_variant=5|gather profile|FAIL'; done"
step suite 120 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'perf\]|gather profile' "
step ncu 60 "ncu -k regex:union_kernel --launch-skip 40 --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis -o $L/un -f $T --filter='GATHER_GPU_KV_PERF' > $L/ncu.out 2>&1; ncu -i $L/un.ncu-rep --page source --csv --print-source=sass > $L/un_src.csv 2>&1; ncu -i $L/un.ncu-rep > $L/un_details.txt 2>&1; echo done"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -8; grep -B2 -A10 'Failure' $L/suite.log | head -40
grep -E '^==|lists=per-kv-head group_union=1 path=default overlap=off' $L/perf.log | sed -E 's/.*median/median/' | cut -c1-250
