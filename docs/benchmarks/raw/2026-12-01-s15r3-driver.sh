#!/usr/bin/env bash
# Session 15 round 3: varlen on the sm90 path (make_tile reads cu_seqlens, TMA rows offset by the sequence's
# begin, V rows past a sequence's end zeroed by the producer); the attention suite on the sm90 path; sanitizers
# on the gap cases; dense BENCH old (base) vs new binary interleaved; the varlen BENCH rows.
TAG=s15r3; BUDGET=${BUDGET:-420}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack base $B/base
step varlen 120 "$B/new --filter='varlen|SM90_SELECTED'"
step suite 200 "$B/new --filter='^(BSA|DENSE|SM90)(?!.*path=portable)'"
step san 100 "compute-sanitizer --tool memcheck $B/new --filter='gap_k(?!.*portable)' 2>&1 | grep -E 'ERROR SUMMARY|PASSED|FAILED' | tail -3; compute-sanitizer --tool racecheck $B/new --filter='gap_k.*blkk=64.*causal=1(?!.*portable)' 2>&1 | grep -E 'RACECHECK SUMMARY|PASSED|FAILED' | tail -3; compute-sanitizer --tool synccheck $B/new --filter='DENSE.*gap_k.*d=128.*causal=0(?!.*portable)' 2>&1 | grep -E 'SUMMARY|PASSED|FAILED' | tail -3"
step bench 150 "for b in base new base new; do echo \$b; SPARGE_BENCH=dense \$B/\$b --filter='BENCH_ATTENTION' 2>&1 | grep BENCH; done"
step vbench 60 "SPARGE_BENCH=varlen $B/new --filter='BENCH_ATTENTION' 2>&1 | grep BENCH"
{ cat $L/summary.txt; for f in varlen suite; do grep -E "FAILED|Failure" $L/$f.log | head -20; grep -E "tests ran|PASSED  \]" $L/$f.log; done; cat $L/san.log $L/bench.log $L/vbench.log; } > $L/all.txt
cat $L/all.txt
