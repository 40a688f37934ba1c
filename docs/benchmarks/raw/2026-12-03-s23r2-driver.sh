#!/usr/bin/env bash
# Session 23 round 2: (1) the SM clock and board power while the kernels run back to back (SPARGE_TRACE_STEADY),
# sampled by nvidia-smi every 50 ms: dense 176 at b2 h32 s16384, LUT 128x128 at 0.4 / 0.1; (2) HND (compare.py's
# layout) against NHD for the dense 176 tile at compare.py's gather shape and at b2 h32 s16384, and LUT 0.4.
TAG=s23r2; BUDGET=${BUDGET:-240}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
nvidia-smi --help-query-gpu | grep -iE "reason|event" | head -20 > $L/smi_fields.log
F=clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$F --format=csv,noheader > /dev/null 2>&1 || F=clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active
sample() { nvidia-smi --query-gpu=$F --format=csv,noheader -lms 50 > $L/$1.smi 2>&1 & SP=$!; }
for k in d176:1.0:176:10:150 l04:0.4:128:10:300 l01:0.1:128:10:1000; do
  IFS=: read n d b t r <<< "$k"
  sample pw_$n; step pw_$n 30 "SPARGE_TRACE_STEADY=$r $B/trace $d $b $t 4"; kill $SP 2>/dev/null; wait $SP 2>/dev/null
done
G="SPARGE_TRACE_SHAPE=1,32,8,1024,16384"
for rep in 1 2 3; do
  step g_nhd_r$rep 20 "$G SPARGE_TRACE_STEADY=500 $B/trace 1.0 176 50 4"
  step g_hnd_r$rep 20 "$G SPARGE_TRACE_HND=1 SPARGE_TRACE_STEADY=500 $B/trace 1.0 176 50 4"
done
for rep in 1 2; do
  step d_nhd_r$rep 30 "SPARGE_TRACE_STEADY=60 $B/trace 1.0 176 10 4"
  step d_hnd_r$rep 30 "SPARGE_TRACE_HND=1 SPARGE_TRACE_STEADY=60 $B/trace 1.0 176 10 4"
  step l04_nhd_r$rep 30 "SPARGE_TRACE_STEADY=100 $B/trace 0.4 128 10 4"
  step l04_hnd_r$rep 30 "SPARGE_TRACE_HND=1 SPARGE_TRACE_STEADY=100 $B/trace 0.4 128 10 4"
done
{ cat $L/summary.txt; for f in $L/pw_*.log $L/g_*.log $L/d_*.log $L/l04_*.log; do echo "== $(basename $f)"; grep -E " ms |steady" $f; done
  for f in $L/pw_*.smi; do echo "== $(basename $f) ($(wc -l < $f) samples)"; awk -F', ' '{print $1, $3, $5, $6}' $f | sort | uniq -c | sort -rn | head -8; done
  cat $L/smi_fields.log; } > $L/all.txt
cd $L && tar czf logs.tgz *.log *.smi && rm -f *.log *.smi
cat $L/all.txt
