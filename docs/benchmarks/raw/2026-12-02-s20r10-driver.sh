#!/usr/bin/env bash
# Session 20 round 10: ncu source counters (stall samples per SASS instruction) of the 128x128 LUT kernel at topk 0.4
# (the kernel of #7's FlexAttention comparison), one launch inside `sparge bench`.
TAG=s20r10; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack cli $B/cli
step ncu 150 "ncu --clock-control none --kernel-name-base mangled --kernel-name regex:attention_kernel.*Li128ELi128ELi128ELb0ELb0E --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats -o /tmp/prof $B/cli bench -topk=0.4 -blkk=128 -warmup=1 -repeat=2 -seed=5"
step src 60 "ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass | gzip -c > $L/src.csv.gz"
step det 30 "ncu -i /tmp/prof.ncu-rep --page details > $L/details.txt"
{ cat $L/summary.txt; ls -la $L; grep -E "Duration|Warp Cycles Per Issued|Issued Warp|No Eligible" $L/details.txt | head; } > $L/all.txt
cat $L/all.txt
