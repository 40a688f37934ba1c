#!/usr/bin/env bash
# Session 23 round 1: the chained consumers (consumer_chain, default on; bit 1048576 = the per-tile consumers)
# A/B in the trace harness against HEAD de25627's binary (trace0) and the same binary with bit 1048576, alternating
# processes, LUT 128x128 at density 0.1 / 0.4 / 1.0 and paired 128x64 at 0.1 / 0.4; then the GPU suite, compare.py,
# and the gather-shape dense question of s22 (stagger on / off, multicast / split / persistence off).
TAG=s23r1; BUDGET=${BUDGET:-575}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace; unpack trace0 $B/trace0; unpack gpu $B/gpu
( cd ../python && MAX_JOBS=10 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
NC="SPARGE_SM90_VARIANT=1048576"
for rep in 1 2 3 4; do
  step l01_base_r$rep 20 "$B/trace0 0.1 128 40 4"; step l01_chain_r$rep 20 "$B/trace 0.1 128 40 4"; step l01_nochain_r$rep 20 "$NC $B/trace 0.1 128 40 4"
done
for rep in 1 2 3; do
  step l04_base_r$rep 20 "$B/trace0 0.4 128 30 4"; step l04_chain_r$rep 20 "$B/trace 0.4 128 30 4"; step l04_nochain_r$rep 20 "$NC $B/trace 0.4 128 30 4"
done
for rep in 1 2 3; do
  step p01_chain_r$rep 20 "$B/trace 0.1 64 40 4"; step p01_nochain_r$rep 20 "$NC $B/trace 0.1 64 40 4"
  step l01_en_r$rep 20 "SPARGE_SM90_VARIANT=1024 $B/trace 0.1 128 40 4"
done
for rep in 1 2; do
  step p04_chain_r$rep 20 "$B/trace 0.4 64 30 4"; step p04_nochain_r$rep 20 "$NC $B/trace 0.4 64 30 4"
  step l10_base_r$rep 20 "$B/trace0 1.0 128 20 4"; step l10_chain_r$rep 20 "$B/trace 1.0 128 20 4"
done
step suite 330 "$B/gpu --filter='^(?!BENCH)'"
wait $PB
step compare 200 "cd .. && python3 bench/compare.py --d 128,64 --topk 0.4,0.1 --pv-ab --fp8 --ab 20 --out $L --tag s23r1"
G="SPARGE_TRACE_SHAPE=1,32,8,1024,16384"
for rep in 1 2; do
  for m in 4 6; do step g_m${m}_r$rep 15 "$G $B/trace 1.0 176 100 $m"; done
  for v in 8192 16384 64; do step g_v${v}_r$rep 15 "$G SPARGE_SM90_VARIANT=$v $B/trace 1.0 176 100 4"; done
done
{ cat $L/summary.txt; tail -1 $L/pybuild.log; for f in $L/l*.log $L/p*.log $L/g_*.log; do echo "== $(basename $f) $(grep -E ' ms ' $f | head -1)"; done
  grep -E '^\[  (PASSED|FAILED)' $L/suite.log | head -30; sed -n '/^Targets/,$p' $L/compare.log; grep -E "A/B x" $L/compare.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
