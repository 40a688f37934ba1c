#!/usr/bin/env bash
# Session 15 round 2: correctness of TOPK|COMPACT|GATHER|SPLIT_TAIL with the one-pass topk kernel (round 1 lost
# the verdicts to a closed pipe), and where the Python call's host time goes.
TAG=s15r2; BUDGET=${BUDGET:-420}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=14 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step tok 240 "$B/new --filter='^(?!GATHER_GPU(_KV|_MHA)?_(FAST_)?PERF)(TOPK|COMPACT|GATHER|DENSE_SPLIT|BSA_SPLIT)'"
wait $PB
step py 90 "cd .. && python3 build-dev/drv/topk_py.py"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E "FAILED|Failure|error" $L/tok.log | head -30; grep -cE "^\[ +OK|PASSED" $L/tok.log; tail -4 $L/tok.log; cat $L/py.log; } > $L/all.txt
cat $L/all.txt
