#!/usr/bin/env bash
# Session 14 round 7: the split cases at HEAD (LSE-less combine added), the top-k perf rows of the C++ suite, and
# a second sample of compare.py's token section (s14r6 had topk_select at 2.58x torch.topk, 3.35x in s14r2).
TAG=s14r7; BUDGET=${BUDGET:-300}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step split 60 "$B/new --filter='(v=3|SPLIT_TAIL)(?!.*path=portable)' 2>&1 | grep -E 'PASSED|FAILED|Failure' | head"
step topk 60 "$B/new --filter='TOPK_GPU\(r=512' 2>&1 | grep -E 'perf|PASSED|FAILED' | head"
wait $PB
step compare 100 "cd .. && python3 bench/compare.py --d 128 --causal no --topk 1.0 --no-flex --token --out $L --tag s14r7"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; cat $L/split.log $L/topk.log; grep -E "cuDNN SDPA  |sparge dense  |topk_select|torch.topk|gather union kv-lists swap=0.0 |of dense" $L/compare.log | head -24; } > $L/all.txt
cat $L/all.txt
