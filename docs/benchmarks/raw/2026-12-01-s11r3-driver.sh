#!/usr/bin/env bash
# Session 11 round 3 (#5): the ws producer's rows remapped (16-byte key copies, IMAD.WIDE row addresses,
# untested copies except in the last step). Suite, perf r1 vs new, ncu source counters of the new ws kernel.
TAG=s11r3; BUDGET=${BUDGET:-400}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack sparge_gpu_tests $B/new; unpack r1_tests $B/r1
T=$B/new; O=$B/r1
step perf 90 "for r in 1 2; do for x in $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\]|gather profile|FAIL' | grep -E 'path=ws|path=default|path=wgmma' | grep -v union_variant=[01234] | head -60; done; done"
step suite 280 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'perf\]|gather profile' "
step ncu 80 "ncu -k regex:attention_ws --launch-skip 3 --launch-count 1 --section WarpStateStats --section SchedulerStats --section SourceCounters --import-source no -o $L/ws -f $T --filter='GATHER_GPU_KV_PERF' > $L/ncu_run.txt 2>&1; ncu -i $L/ws.ncu-rep --page details > $L/details.txt 2>&1; ncu -i $L/ws.ncu-rep --page source --csv --print-source=sass > $L/src.csv 2>&1; rm -f $L/ws.ncu-rep"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -20; grep -B2 -A10 'Failure' $L/suite.log | head -60
grep -E '^==|perf\]' $L/perf.log | sed -E 's/union overlap.*max/max/' | cut -c1-200
grep -E "Duration|Issued Warp|Warp Cycles Per Issued|No Eligible|Active Warps|Eligible Warps" $L/details.txt | head
