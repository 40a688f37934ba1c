#!/usr/bin/env bash
# Session 13 round 6: mbarrier waits with a suspend-time hint (new) vs the spin (old): BENCH, gather, block map; then the whole suite on new.
TAG=s13r6; BUDGET=${BUDGET:-480}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack old $B/old
for i in 1 2; do for b in old new; do
  echo "== $b #$i" >> $L/bench.txt
  step bench_${b}_$i 40 "SPARGE_BENCH=1 $B/$b --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH' >> $L/bench.txt"
done; done
for b in old new; do
  echo "== $b" >> $L/gather.txt
  step gather_$b 60 "SPARGE_BENCH=1 $B/$b --filter='GATHER_GPU_KV_PERF|BLOCKMAP_GPU_BENCH' 2>&1 | grep -vE '^\[ RUN|^\[       OK|gather profile' >> $L/gather.txt"
done
step gpu 230 "$B/new 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'gather profile' > $L/gpu.txt"
cat $L/summary.txt; cat $L/bench.txt; cat $L/gather.txt | head -60
grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/gpu.txt | head -12; grep -B2 -A12 'Failure' $L/gpu.txt | head -40
