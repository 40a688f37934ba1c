#!/usr/bin/env bash
# Session 11 round 9: ncu source counters of the union kernel (kv-head lists) at PERF.md's shape.
TAG=s11r9; BUDGET=${BUDGET:-120}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack sparge_gpu_tests $B/new
T=$B/new
step ncu 100 "ncu -k regex:union_kernel --launch-skip 17 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --import-source no -o $L/u -f $T --filter='GATHER_GPU_KV_PERF' > $L/ncu_run.txt 2>&1; ncu -i $L/u.ncu-rep --page details > $L/details.txt 2>&1; ncu -i $L/u.ncu-rep --page source --csv --print-source=sass > $L/src.csv 2>&1; rm -f $L/u.ncu-rep"
cat $L/summary.txt; grep -E "Duration|Throughput|Issued Warp|Warp Cycles Per Issued|No Eligible|Active Warps|Eligible Warps|Grid Size|Block Size|Registers" $L/details.txt | head -30
