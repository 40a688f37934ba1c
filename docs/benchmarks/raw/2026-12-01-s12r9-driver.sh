#!/usr/bin/env bash
# Session 12 round 9: the whole GPU suite at the session's final code.
TAG=s12r9; BUDGET=${BUDGET:-215}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
step gpu 200 "$B/new 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'gather profile'"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/gpu.log | head -12; grep -B2 -A12 'Failure' $L/gpu.log | head -40
