#!/usr/bin/env bash
# Session 19 round 1: the whole GPU suite (not the BENCH rows) at f71cb58 + the softmax variants (defaults as
# shipped), then sparge_sm90_trace's key-tile intervals for softmax modes 0..4 at densities 0.1 and 0.4.
TAG=s19r1; BUDGET=${BUDGET:-580}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
unpack trace $B/trace
for d in 0.1 0.4; do for m in 0 1 2 3 4; do
  step trace_${d}_$m 40 "$B/trace $d 128 50 $m"
done; done
step suite 400 "$B/new --filter='^(?!BENCH)' 2>&1 | tail -60"
{ cat $L/summary.txt; grep -E "FAILED|Failure|tests ran|PASSED  \]|SKIPPED" $L/suite.log | head -30;
  for f in $L/trace_*.log; do echo "== $(basename $f)"; grep -E "whole|softmax mode|median|us" $f | head -12; done; } > $L/all.txt
cat $L/all.txt
