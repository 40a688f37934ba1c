#!/usr/bin/env bash
# Session 28 round 2 (HEAD's binary): racecheck on the persistent ws walk with every hazard printed and grouped by
# (read site, write site); ncu source counters of the persistent attention kernel at PERF.md's gather shape; the
# attention step's sensitivity to the ws switches (stages, pingpong, pairing).
TAG=s28r2; BUDGET=${BUDGET:-400}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack gpu $B/gpu
step racecheck 120 "SPARGE_GATHER_WS_PERSIST_CTAS=1 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 10000000 $B/gpu --filter='GATHER_GPU_WS_SMALL' | grep -E '^=========     (Read|Write) |SUMMARY|PASSED|FAILED' | sed -E 's/Thread \\([0-9]+,[0-9]+,[0-9]+\\)//; s/\\+0x[0-9a-f]+//' | sort | uniq -c | sort -rn | head -40"
step ncu 120 "ncu -k 'regex:attention_ws' --launch-skip 12 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters -o $L/a -f $B/gpu --filter='GATHER_GPU_KV_PERF\\(' > /dev/null 2>&1; ncu -i $L/a.ncu-rep --page details 2>&1 | head -300; ncu -i $L/a.ncu-rep --page source --csv --print-source=sass > $L/asrc.csv 2>&1; xz -T4 $L/asrc.csv"
P="$B/gpu --filter='GATHER_GPU_KV_PERF\\('"
step p_default 40 "$P"
step p_st3 40 "SPARGE_GATHER_WS_STAGES=3 $P"
step p_st2 40 "SPARGE_GATHER_WS_STAGES=2 $P"
step p_nopp 40 "SPARGE_GATHER_WS_PINGPONG=0 $P"
step p_pair 40 "SPARGE_GATHER_WS_PAIR=1 $P"
step p_default2 40 "$P"
{ cat $L/summary.txt; cat $L/machine.txt
  echo "== racecheck"; cat $L/racecheck.log
  echo "== ncu"; grep -vE "^\s*$" $L/ncu.log | grep -E "attention_ws|Throughput|Duration|Pipe|Issue|Eligible|Active Warps|Stall|Warp Cycles|No Eligible|One or More|L2 Hit|Bank|Executed Ipc|SM Busy" | head -60
  for f in $L/p_*.log; do echo "== $(basename $f)"; grep -E "^\[perf\] gather hd128 keys=2048 lists=per-kv-head group_union=1 path=default (per-tile )?overlap|gather profile|^\[perf\] gather hd64 lists=per-kv-head keys=2048 group_union=1 path=default" $f | head -14 | sed -E 's/keys=2048 //; s/union overlap.*max/max/' | cut -c1-240; done
} > $L/all.txt
cd $L && tar czf logs.tgz *.log && rm -f *.log
cat $L/all.txt
