#!/usr/bin/env bash
# Session 27 round 1: gather ws with Q in registers (new) vs HEAD (old), back to back x3; the K-staged epilogue's
# trace A/B against HEAD at densities 0.1 / 0.4; then the whole GPU suite on the new binary (V-staged code + Q regs).
TAG=s27r1; BUDGET=${BUDGET:-585}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu; unpack gpu_old $B/old; unpack trace_old $B/t_old; unpack trace_k $B/t_k
G="--filter='GATHER_GPU_KV_PERF'"
for i in 1 2 3; do
  step g_old_$i 40 "$B/old $G"
  step g_new_$i 40 "$B/gpu $G"
done
step g_old_mha 40 "$B/old --filter='GATHER_GPU_MHA_PERF'"
step g_new_mha 40 "$B/gpu --filter='GATHER_GPU_MHA_PERF'"
step ncu 90 "ncu -k 'regex:union_kernel|attention_ws' --launch-skip 80 --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SourceCounters -o $L/g -f $B/gpu --filter='GATHER_GPU_KV_PERF\\(' > /dev/null 2>&1; ncu -i $L/g.ncu-rep --page details 2>&1 | head -400; ncu -i $L/g.ncu-rep --page source --csv --print-source=sass > $L/src.csv 2>&1; xz -T4 $L/src.csv"
export SPARGE_TRACE_HND=1
for i in 1 2 3; do
  step t_old_d01_$i 20 "SPARGE_TRACE_STEADY=600 $B/t_old 0.1 128 10 0"
  step t_k_d01_$i 20 "SPARGE_TRACE_STEADY=600 $B/t_k 0.1 128 10 0"
done
step t_old_p025 20 "SPARGE_TRACE_STEADY=600 $B/t_old 0.098 64 10 0"
step t_k_p025 20 "SPARGE_TRACE_STEADY=600 $B/t_k 0.098 64 10 0"
step t_old_d04 20 "SPARGE_TRACE_STEADY=200 $B/t_old 0.4 128 10 0"
step t_k_d04 20 "SPARGE_TRACE_STEADY=200 $B/t_k 0.4 128 10 0"
unset SPARGE_TRACE_HND
step gpu_all 330 "$B/gpu"
{ cat $L/summary.txt
  for f in $L/g_*.log; do echo "== $(basename $f)"; grep -E "perf\]|gather profile" $f | grep -E "per-kv-head group_union=1 path=(default|ws) overlap=off union_variant=5|check_lists=0|mha|profile" | sed -E 's/keys=2048 //; s/union overlap.*//' | cut -c1-230; done
  for f in $L/t_*.log; do echo "== $(basename $f)"; grep -E "steady|tile \(e0|ctor" $f; done
  echo "== ncu"; grep -vE "^\s*$" $L/ncu.log | grep -E "attention_ws|union_kernel|Throughput|Duration|Pipe|Issue|Eligible|Active Warps|Stall|Registers|L1/TEX Hit|L2 Hit|Bank|Executed Ipc|SM Busy|Mem Busy|Max Bandwidth|Memory Throughput" | head -80
  echo "== gpu_all"; grep -E "^\[  FAILED|^\[  PASSED|tests ran|FAILED TEST" $L/gpu_all.log | tail -15; grep -c "^\[       OK" $L/gpu_all.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
