#!/usr/bin/env bash
# Session 18 round 2: the staged epilogue (O through the Q buffer + TMA stores). Trace A/B of its variants
# on the 128 x 128 LUT kernel (one Q buffer at hd128: 262144 = staged on one buffer, | 1024 = the next tile's
# Q prefetched into L2 and its first K/V stage before the Q wait; 524288 = register epilogue), BENCH rows
# under the same bits, then the whole GPU suite and a memcheck of the new cases.
TAG=s18r2; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
chmod +x pack/sparge_sm90_trace
step trace 80 "for d in 0.4 0.1; do for v in 524288 262144 263168 0; do echo \"== v=\$v\"; SPARGE_SM90_VARIANT=\$v pack/sparge_sm90_trace \$d 128 30; done; done; for v in 524288 262144 263168; do echo \"== v=\$v\"; SPARGE_SM90_VARIANT=\$v pack/sparge_sm90_trace 0.1 64 30; done"
for i in 1 2; do
  for v in 524288 262144 263168; do
    step bench_${v}_$i 60 "SPARGE_BENCH=1 SPARGE_SM90_VARIANT=$v $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
  done
done
step suite 330 "$B/new --filter='^(?!BENCH)'"
step sanitize 60 "compute-sanitizer --tool memcheck --error-exitcode 99 $B/new --filter='sq=2100.*d=128,blkq=128,blkk=128|varlen=256:300.*d=128' 2>&1 | tail -4"
{ cat $L/summary.txt; grep -E "FAILED|Failure" $L/suite.log | head -20; grep -E "tests ran|PASSED  \]|SKIPPED \]" $L/suite.log; cat $L/sanitize.log; for f in $L/bench_*.log; do echo "== $(basename $f)"; grep -E "dense|density=0.40 |density=0.10 |skewed:" $f | grep -v "pv=on" | sed 's/portable *[0-9.]* TFLOPS//; s/(x[0-9.]*)//' | tr -s ' '; done; grep -E "^==|variant|epilogue|walk|to next|Q wait|tile \(|tile - n" $L/trace.log; } > $L/all.txt
cat $L/all.txt
