#!/usr/bin/env bash
# Session 13 round 5: ncu source counters (stall samples per SASS instruction) of the dense 176 kernel.
TAG=s13r5; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
step ncu 150 "SPARGE_BENCH=1 ncu --clock-control none --kernel-name-base mangled --kernel-name regex:Li176E --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats --section SchedulerStats -o /tmp/prof $B/new --filter=BENCH_ATTENTION"
step src 60 "ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > $L/src.csv"
step raw 60 "ncu -i /tmp/prof.ncu-rep --page raw --csv > $L/raw.csv"
step det 60 "ncu -i /tmp/prof.ncu-rep --page details > $L/details.txt"
cat $L/summary.txt
python3 drv/ncu_sum.py $L/src.csv 30 | head -80
gzip $L/src.csv
