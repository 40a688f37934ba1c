#!/usr/bin/env bash
# Session 15 round 6: causal dense hd128 with K/V multicast (clusters of qb, qb - 1 walking the longer row).
# DENSE|SM90 on the sm90 path (new causal mc cases included), sanitizers on mc causal cases, dense BENCH
# base (HEAD a3c57b5) vs new in 4 interleaved pairs.
TAG=s15r6; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack base $B/base
step tests 120 "$B/new --filter='^(DENSE|SM90)(?!.*path=portable)'"
step san 90 "compute-sanitizer --tool memcheck $B/new --filter='DENSE.*d=128.*causal=1(?!.*portable)(?!.*v=32)' 2>&1 | grep -E 'ERROR SUMMARY|PASSED|FAILED' | tail -3; compute-sanitizer --tool racecheck $B/new --filter='DENSE\(dt=f16,b=1,hq=2,hk=1,sq=512,sk=357,d=128,causal=1,lse=1,layout=NHD,o=f32\)$' 2>&1 | grep -E 'RACECHECK SUMMARY|PASSED|FAILED' | tail -3; compute-sanitizer --tool synccheck $B/new --filter='DENSE\(dt=f16,b=1,hq=2,hk=1,sq=256,sk=700,d=128,causal=1,lse=1,layout=NHD,o=f32\)$' 2>&1 | grep -E 'SUMMARY|PASSED|FAILED' | tail -3"
step bench 120 "for b in base new base new base new base new; do echo \$b; SPARGE_BENCH=dense $B/\$b --filter='BENCH_ATTENTION' 2>&1 | grep 'BENCH dense'; done"
{ cat $L/summary.txt; grep -E "FAILED|Failure" $L/tests.log | head -20; grep -E "tests ran|PASSED  \]" $L/tests.log; cat $L/san.log; grep -v "d=64" $L/bench.log | paste - - -; } > $L/all.txt
cat $L/all.txt
