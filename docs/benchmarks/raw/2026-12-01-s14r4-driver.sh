#!/usr/bin/env bash
# Session 14 round 4: same-process LUT vs dense at 128x128 (bit 4096: the dense row is the 128x128 tile; 4096|64 no
# persistence), then the whole GPU suite on new.
TAG=s14r4; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
for i in 1 2; do for v in 4096 4160; do
  echo "== v=$v #$i" >> $L/bench.txt
  step bench_${v}_$i 50 "SPARGE_SM90_VARIANT=$v SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH (dense  |sparse blkq=128 blkk=128 density=1|sparse blkq=128 blkk=128 density=0.40 p|sparse blkq=128 blkk=128 density=0.10 p)' >> $L/bench.txt"
done; done
step gpu 300 "$B/new 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'gather profile' > $L/gpu.txt"
{ cat $L/summary.txt; cat $L/bench.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/gpu.txt | head -12; grep -B2 -A12 'Failure' $L/gpu.txt | head -40; } > $L/all.txt
cat $L/all.txt
