#!/usr/bin/env bash
# Session 20 round 1: the whole GPU suite (not the BENCH rows) at 695980b, incl. session 19's peaked-row cases
# against the shipped kernel; the trace tool's mode 1; ncu pipe counts of the 128x128 LUT kernel.
TAG=s20r1; BUDGET=${BUDGET:-585}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
unpack trace $B/trace
step trace_0.4_m1 40 "$B/trace 0.4 128 50 1"
step trace_64_m1 20 "$B/trace 0.4 64 5 1"
step suite 420 "$B/new --filter='^(?!BENCH)' 2>&1 | tail -60"
step ncu 90 "ncu --kernel-name regex:attention_kernel --launch-count 1 --metrics smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_fmaheavy.sum,smsp__inst_executed_pipe_fmalite.sum,smsp__inst_executed_pipe_fp16.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_xu_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active $B/trace 0.4 128 1 0"
{ cat $L/summary.txt; grep -E "FAILED|Failure|tests ran|PASSED  \]|SKIPPED|peaked" $L/suite.log | head -30;
  for f in $L/trace_*.log; do echo "== $(basename $f)"; head -40 $f; done; tail -25 $L/ncu.log; } > $L/all.txt
cat $L/all.txt
