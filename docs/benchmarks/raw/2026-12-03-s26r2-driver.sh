#!/usr/bin/env bash
# Session 26 round 2: power and SM clock of the sm90 LUT kernel and FlexAttention held in steady state
# (tools/dev/power_probe.py); the what-if of a tile without its O stores (SPARGE_TRACE_NOEPI), back to back.
TAG=s26r2; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
export SPARGE_TRACE_HND=1
for i in 1 2 3; do
  step epi_d01_$i 20 "SPARGE_TRACE_STEADY=600 $B/trace 0.1 128 10 0"
  step noepi_d01_$i 20 "SPARGE_TRACE_NOEPI=1 SPARGE_TRACE_STEADY=600 $B/trace 0.1 128 10 0"
done
step staged_d01 20 "SPARGE_SM90_VARIANT=262144 SPARGE_TRACE_STEADY=600 $B/trace 0.1 128 10 0"
for i in 1 2; do
  step epi_d04_$i 20 "SPARGE_TRACE_STEADY=200 $B/trace 0.4 128 10 0"
  step noepi_d04_$i 20 "SPARGE_TRACE_NOEPI=1 SPARGE_TRACE_STEADY=200 $B/trace 0.4 128 10 0"
done
step power 180 "python3 ../tools/dev/power_probe.py $B/trace --density 0.1,0.4,1.0 --seconds 3"
{ cat $L/summary.txt; for f in $L/*epi*.log $L/staged*.log; do echo "== $(basename $f)"; grep -E "steady|median of|epilogue|tile \(e0|last PV|ctor|per key|Q wait|next tile|first QK" $f; done;
  echo "== power"; tail -12 $L/power.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
