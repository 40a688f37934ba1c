#!/usr/bin/env bash
# Session 11 round 2 (#5): ncu of the ws attention kernel (default path) at PERF.md's gather shape.
TAG=s11r2; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack sparge_gpu_tests $B/new
T=$B/new
step ncu 150 "ncu -k regex:attention_ws --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --import-source no -o $L/ws -f $T --filter='GATHER_GPU_KV_PERF' > $L/ncu_run.txt 2>&1; ncu -i $L/ws.ncu-rep --page details > $L/details.txt 2>&1; ncu -i $L/ws.ncu-rep --page source --csv --print-source=sass > $L/src.csv 2>&1; rm -f $L/ws.ncu-rep; ls -la $L"
cat $L/summary.txt; tail -5 $L/ncu_run.txt; grep -E "Duration|Issue Slots|Warp Cycles Per Issued|No Eligible|Active Warps|Eligible Warps|Stall|Throughput|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" $L/details.txt | head -50
