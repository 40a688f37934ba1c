#!/usr/bin/env bash
# Session 19 round 4: Traits::kMaxSlack 8 (mode 0 / 1) against the exact running max (mode 2 / 3), trace harness,
# densities 0.1, 0.4, 1.0, modes interleaved, three repetitions.
TAG=s19r4; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack trace $B/trace
for rep in 1 2 3; do for d in 0.1 0.4 1.0; do for m in 2 0 3 1; do
  [ $rep -gt 1 ] && [ $m -ge 1 ] && [ $m -ne 2 ] && [ $m -ne 0 ] && continue
  step trace_${d}_${m}_$rep 40 "$B/trace $d 128 50 $m"
done; done; done
{ for f in $L/trace_*.log; do echo "$(basename $f .log) $(grep -E '^blk' $f | sed 's/.*variant 0: //')"; done;
  for f in $L/trace_*_[13]_1.log; do echo "== $(basename $f)"; grep -E "key tile 3|tile - n x|per key tile" $f; done; } > $L/all.txt
cat $L/all.txt
