#!/usr/bin/env bash
# Session 12 round 2: union kernel source-level profile (kv lists), summarised on the device.
TAG=s12r2; BUDGET=${BUDGET:-120}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
[ -x $B/new ] || unpack new $B/new
T=$B/new
step ncu 80 "ncu -k regex:union_kernel --launch-skip 40 --launch-count 1 --section SourceCounters --section WarpStateStats --metrics smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_atom.sum,smsp__cycles_active.avg,sm__warps_active.avg.pct_of_peak_sustained_active -o $L/un -f $T --filter='GATHER_GPU_KV_PERF' > $L/ncu.out 2>&1; ncu -i $L/un.ncu-rep --page source --csv --print-source=sass > /tmp/un_src.csv 2>&1; python3 drv/ncu_sum.py /tmp/un_src.csv 80 > $L/un_sum.txt 2>&1; ncu -i $L/un.ncu-rep --page details > $L/un_details.txt 2>&1; rm -f $L/un.ncu-rep; echo done"
cat $L/summary.txt; head -100 $L/un_sum.txt; grep -E "inst_executed|bank|wavefronts|cycles_active|warps_active|Duration" $L/un_details.txt
