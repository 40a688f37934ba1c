#!/usr/bin/env bash
# Session 15 round 4: varlen on the sm90 path with the V fix as bulk copies of zeros (after the V TMA
# lands); poisoned-next-sequence cases, persistent / split varlen hooks; the attention suite on the sm90
# path; sanitizers; dense BENCH base vs new interleaved; varlen BENCH rows.
TAG=s15r4; BUDGET=${BUDGET:-420}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack base $B/base
step varlen 120 "$B/new --filter='varlen|SM90_SELECTED'"
step suite 200 "$B/new --filter='^(BSA|DENSE|SM90)(?!.*path=portable)'"
step san 100 "compute-sanitizer --tool memcheck $B/new --filter='(poison|varlen.*v=)(?!.*portable)' 2>&1 | grep -E 'ERROR SUMMARY|PASSED|FAILED' | tail -3; compute-sanitizer --tool racecheck $B/new --filter='poison.*blkq=128,blkk=64.*causal=1(?!.*portable)' 2>&1 | grep -E 'RACECHECK SUMMARY|PASSED|FAILED' | tail -3; compute-sanitizer --tool synccheck $B/new --filter='poison.*d=128,blkq=128,blkk=128.*causal=0(?!.*portable)' 2>&1 | grep -E 'SUMMARY|PASSED|FAILED' | tail -3"
step bench 150 "for b in base new base new; do echo \$b; SPARGE_BENCH=dense $B/\$b --filter='BENCH_ATTENTION' 2>&1 | grep BENCH; done"
step vbench 60 "SPARGE_BENCH=varlen $B/new --filter='BENCH_ATTENTION' 2>&1 | grep BENCH; SPARGE_SM90_VARIANT=8192 SPARGE_BENCH=varlen $B/new --filter='BENCH_ATTENTION' 2>&1 | grep BENCH"
{ cat $L/summary.txt; for f in varlen suite; do grep -E "FAILED|Failure" $L/$f.log | head -20; grep -E "tests ran|PASSED  \]" $L/$f.log; done; cat $L/san.log $L/bench.log $L/vbench.log; } > $L/all.txt
cat $L/all.txt
