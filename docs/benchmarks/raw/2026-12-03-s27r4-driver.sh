#!/usr/bin/env bash
# Session 27 round 4 -- NOT RUN (no device time left): compute-sanitizer on the persistent ws walk, one CTA walking both tiles of
# GATHER_GPU_WS_SMALL's 160-row group (SPARGE_GATHER_WS_PERSIST_CTAS=1): memcheck, then synccheck.
TAG=s27r4; BUDGET=${BUDGET:-150}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu
export SPARGE_GATHER_WS_PERSIST_CTAS=1
step memcheck 70 "compute-sanitizer --tool memcheck --error-exitcode 9 $B/gpu --filter='GATHER_GPU_WS_SMALL'"
step synccheck 60 "compute-sanitizer --tool synccheck --error-exitcode 9 $B/gpu --filter='GATHER_GPU_WS_SMALL'"
{ cat $L/summary.txt; for t in memcheck synccheck; do echo "== $t"; grep -E "^\[  FAILED|^\[  PASSED|tests ran|ERROR SUMMARY" $L/$t.log | tail -5; grep -c "^\[       OK" $L/$t.log; done; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
