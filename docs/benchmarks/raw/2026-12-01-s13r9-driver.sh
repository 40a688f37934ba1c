#!/usr/bin/env bash
# Session 13 round 9: the gather test refactor (DeviceGather, the trusted perf row folded into the variants).
TAG=s13r9; BUDGET=${BUDGET:-190}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
step gather 180 "$B/new --filter='GATHER' 2>&1 | grep -vE '^\[ RUN|^\[       OK|gather profile' > $L/gather.txt"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/gather.txt | head; grep -B2 -A10 'Failure' $L/gather.txt | head -30
grep -E 'check_lists=0|per-kv-head group_union=1 path=default overlap=off union_variant=5' $L/gather.txt | cut -c1-250
