#!/usr/bin/env bash
# Session 12 round 8: ws the default from 64-row groups; MHA (64-row groups) and hd64 perf rows; gather suite.
TAG=s12r8; BUDGET=${BUDGET:-330}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
T=$B/new
step perf 80 "$T --filter='GATHER_GPU_MHA_PERF|GATHER_GPU_KV_PERF_HD64' 2>&1 | grep -E 'perf\]|gather profile|FAIL|PASSED'"
step suite 150 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'gather profile|perf\]'"
cat $L/summary.txt; cut -c1-230 $L/perf.log; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -8; grep -B2 -A10 'Failure' $L/suite.log | head -30
