#!/usr/bin/env bash
# Session 14 round 1: the split tail + causal on the 176 tile. Correctness (defaults, split hook),
# compute-sanitizer on the 176 tile, then BENCH dense rows: old binary vs new (0, 16384 no split, 4096 128 tiles).
TAG=s14r1; BUDGET=${BUDGET:-540}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack old $B/old
F='PASSED|FAILED|Failure|Expected|Which is|split vs|differs|rc='
step dense 120 "$B/new --filter='^DENSE(?!.*path=portable)|^SM90' 2>&1 | grep -E '$F' | head -40"
step dense_split 90 "SPARGE_SM90_VARIANT=32768 $B/new --filter='^DENSE\((?!.*path=portable)(?!.*v=)' 2>&1 | grep -E '$F' | head -20"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 > $L/smi.log 2>&1 &
SMI=$!
for i in 1 2 3; do
  for v in old:0 new:0 new:16384 new:4096; do
    b=${v%%:*}; vv=${v##*:}
    echo "== $b v=$vv #$i" >> $L/bench.txt
    step bench_${b}_${vv}_$i 40 "SPARGE_SM90_VARIANT=$vv SPARGE_BENCH=dense $B/$b --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH' >> $L/bench.txt"
  done
done
kill $SMI
step memcheck 150 "compute-sanitizer --tool memcheck --error-exitcode 9 $B/new --filter='^DENSE(\(.*d=128|_SPLIT|_PERSISTENT)(?!.*path=portable)' 2>&1 | grep -E 'ERROR SUMMARY|PASSED|FAILED|Invalid|rc=' | head"
step racecheck 60 "compute-sanitizer --tool racecheck --error-exitcode 9 $B/new --filter='^DENSE\(dt=f16,b=1,hq=4,hk=2,sq=(113|1024),.*d=128,causal=.,lse=1,layout=NHD,o=f32(,v=32768)?\)$' 2>&1 | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|hazard' | head"
step synccheck 60 "compute-sanitizer --tool synccheck --error-exitcode 9 $B/new --filter='^DENSE\(dt=f16,b=1,hq=4,hk=2,sq=(113|1024),.*d=128,causal=.,lse=1,layout=NHD,o=f32(,v=32768)?\)$' 2>&1 | grep -E 'ERROR SUMMARY|PASSED|FAILED' | head"
{ cat $L/summary.txt; for s in dense dense_split memcheck racecheck synccheck; do echo "== $s"; cat $L/$s.log; done; cat $L/bench.txt; } > $L/all.txt
cat $L/all.txt
