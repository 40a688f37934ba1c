#!/usr/bin/env bash
# Session 15 round 1: the one-pass topk kernel (variant 0) against the CPU and variant 6 (the old default);
# TOPK|COMPACT|GATHER (DeviceFlags in a ScopedScratch, not yet run on a GPU); SPLIT_TAIL's new check;
# memcheck / racecheck on the one-pass kernel; where the Python call's time goes.
TAG=s15r1; BUDGET=${BUDGET:-420}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=14 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step tok 200 "$B/new --filter='TOPK|COMPACT|GATHER|SPLIT_TAIL' 2>&1 | grep -E 'PASSED|FAILED|Failure|perf|error' | head -60"
step perf 60 "for v in 0 6 0 6; do SPARGE_TOPK_VARIANT=\$v $B/new --filter='TOPK_GPU\(r=512' 2>&1 | grep -E 'perf'; done"
step san 120 "compute-sanitizer --tool memcheck $B/new --filter='TOPK_GPU_STRESS\(r=3,n=131072|TOPK_GPU\(r=16,n=20000,k=2048,dtype=f16,scores=quantised' 2>&1 | grep -E 'ERROR SUMMARY|PASSED|FAILED' | head; compute-sanitizer --tool racecheck $B/new --filter='TOPK_GPU_STRESS\(r=3,n=131072,k=2048,scores=cluster4000,dtype=f32,cs=1|TOPK_GPU\(r=64,n=4096,k=64,dtype=f32,scores=normal' 2>&1 | grep -E 'ERROR SUMMARY|hazard|PASSED|FAILED' | head"
wait $PB
step py 60 "cd .. && python3 build-dev/drv/topk_py.py"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; cat $L/tok.log | grep -v PASSED | head -40; grep -c PASSED $L/tok.log; cat $L/perf.log $L/san.log $L/py.log; } > $L/all.txt
cat $L/all.txt
