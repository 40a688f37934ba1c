#!/usr/bin/env bash
# Session 16 round 4 (final): the whole GPU suite at HEAD, and the BENCH rows after their LUT helper refactor
# (SPARGE_BENCH=1: the skewed LUT's ratio to the dense rate; =causal_lut).
TAG=s16r4; BUDGET=${BUDGET:-520}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
step suite 330 "$B/new --filter='^(?!BENCH)'"
step bench 120 "SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
step causal_lut 40 "SPARGE_BENCH=causal_lut $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
{ cat $L/summary.txt; grep -E "FAILED|Failure" $L/suite.log | head -20; grep -E "tests ran|PASSED  \]|SKIPPED \]" $L/suite.log; cat $L/bench.log $L/causal_lut.log; } > $L/all.txt
cat $L/all.txt
