#!/usr/bin/env bash
# Session 13 round 3: defaults (176 + multicast + persistent) correctness; ncu of our dense kernel and cuDNN's; clocks.
TAG=s13r3; BUDGET=${BUDGET:-330}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
step dense 90 "$B/new --filter='^(DENSE|SM90)(?!.*path=portable)' 2>&1 | grep -E 'seed =|PASSED|FAILED|Failure' | head"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 > $L/smi.txt 2>&1 &
SMI=$!
for i in 1 2; do
  echo "$(date +%T.%N | cut -c1-12) start sparge $i" >> $L/smi.txt
  step bench_$i 60 "SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH dense '"
  echo "$(date +%T.%N | cut -c1-12) start cudnn $i" >> $L/smi.txt
  step cudnn_$i 60 "python3 drv/cudnn.py"
done
echo "$(date +%T.%N | cut -c1-12) end" >> $L/smi.txt
kill $SMI
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy"
step ncu_ours 120 "SPARGE_BENCH=1 ncu --clock-control none --kernel-name-base mangled --kernel-name regex:Li176E --launch-skip 2 --launch-count 1 $SEC $B/new --filter=BENCH_ATTENTION"
step ncu_cudnn 120 "ncu --clock-control none --kernel-name regex:'sdpa|fmha|flash|cudnn' --launch-skip 2 --launch-count 1 $SEC python3 drv/cudnn.py"
cat $L/summary.txt $L/dense.log
for i in 1 2; do cat $L/bench_$i.log $L/cudnn_$i.log; done
cat $L/bench_*.log $L/cudnn_*.log > $L/timing.txt; rm -f $L/bench_*.log $L/cudnn_*.log
