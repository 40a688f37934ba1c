#!/usr/bin/env bash
# Session 18 round 3 (final): the staged-epilogue cases and the determinism cases at the final code, a memcheck
# of the two-Q-buffer staged path (hd64), BENCH rows default vs bit 2048 (two Q buffers + staged epilogue where
# they fit), then compare.py (time-based warm-up and settle) with d 128 and 64, fp8, the A/B pairs.
TAG=s18r3; BUDGET=${BUDGET:-600}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step cases 120 "$B/new --filter='sq=2100|varlen=256:300|SM90_SELECTED|DETERMINISM'"
step sanitize 60 "compute-sanitizer --tool memcheck --error-exitcode 99 $B/new --filter='sq=2100.*d=64.*v=2048' 2>&1 | tail -4"
for i in 1 2; do
  for v in 0 2048; do
    step bench_${v}_$i 60 "SPARGE_BENCH=1 SPARGE_SM90_VARIANT=$v $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
  done
done
wait $PB
step compare 300 "cd .. && python3 bench/compare.py --d 128,64 --topk 0.4,0.1 --pv-ab --fp8 --ab 20 --out $L --tag s18r3"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E "FAILED|Failure" $L/cases.log | head -20; grep -E "tests ran|PASSED  \]" $L/cases.log; cat $L/sanitize.log; for f in $L/bench_*.log; do echo "== $(basename $f)"; grep -E "dense|density=0.40 |density=0.10 |skewed:" $f | grep -v "pv=on" | sed 's/portable *[0-9.]* TFLOPS//; s/(x[0-9.]*)//' | tr -s ' '; done; sed -n '/^Targets/,$p' $L/compare.log; grep -E "A/B x" $L/compare.log; } > $L/all.txt
cat $L/all.txt
