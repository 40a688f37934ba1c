#!/usr/bin/env bash
# Session 25 round 3: the paired kernels' half tile (default) against the whole masked tile (SPARGE_SM90_VARIANT=1048576),
# back to back in the trace harness (mode 4; 25 blocks per row: every row ends with a half tile; 26: none, the control),
# O digests must agree; the block-sparse / fold / selection GPU cases (BSA_HALF_TILE among them); then compare.py at this
# code (kernel rows and the FlexAttention A/B on both block shapes).
TAG=s25r3; BUDGET=${BUDGET:-580}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
unpack gpu $B/gpu
for i in 1 2 3 4; do
  for v in 0 1048576; do step ab_k64_d0098_v${v}_$i 30 "SPARGE_SM90_VARIANT=$v SPARGE_TRACE_STEADY=600 $B/trace 0.098 64 40 4"; done
done
for v in 0 1048576; do step ab_k64_d0102_v${v} 30 "SPARGE_SM90_VARIANT=$v SPARGE_TRACE_STEADY=600 $B/trace 0.102 64 40 4"; done
for v in 0 1048576; do step ab_k64_d0398_v${v} 30 "SPARGE_SM90_VARIANT=$v SPARGE_TRACE_STEADY=200 $B/trace 0.398 64 40 4"; done
step bsa 200 "$B/gpu --filter='BSA|FOLD_GPU|SM90_SELECTED'"
step pybuild 280 "cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q ."
step compare 120 "cd .. && python3 bench/compare.py --d 128 --causal no --topk 0.4,0.1 --pv-ab --ab 20 --flex-blk 128,128x64 --out $L --tag s25r3"
{ cat $L/summary.txt; grep -E '^\[  (PASSED|FAILED)' $L/bsa.log | head -40; tail -3 $L/bsa.log
  for f in $L/ab_*.log; do echo "== $(basename $f)"; grep -E "ms \(median|digest" $f | head -4; done
  sed -n '/^Targets/,$p' $L/compare.log; grep -E "sparge kernel|FlexAttention" $L/compare.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
