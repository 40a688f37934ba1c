#!/usr/bin/env bash
# Session 14 round 6 (final): the sm90 and gather suites at HEAD (ScopedScratch in the launches, gather test
# refactor), then compare.py twice (full; then d128 at topk 1.0 / 0.4 / 0.1 as a second sample).
TAG=s14r6; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
F='PASSED|FAILED|Failure'
step sm90 150 "$B/new --filter='^(BSA|DENSE|SM90)(?!.*path=portable)' 2>&1 | grep -E '$F' | head -20"
step gather 150 "$B/new --filter='^GATHER' 2>&1 | grep -E '$F|^\[perf\] gather hd128 keys=2048 lists=per-kv-head group_union=1 path=default overlap=off union_variant=5' | head -20"
wait $PB
step compare 240 "cd .. && python3 bench/compare.py --fp8 --pv-ab --token --out $L --tag s14r6"
step compare2 120 "cd .. && python3 bench/compare.py --d 128 --topk 1.0,0.4,0.1 --fp8 --out $L --tag s14r6b"
{ cat $L/summary.txt; tail -2 $L/pybuild.log; cat $L/sm90.log $L/gather.log; grep -E "^==|cuDNN SDPA  |sparge dense  |FlexAttention 128|sparge kernel 128x128|sparge_attn fp8 topk=0.(4|1) pvthreshd=None|sparge_attn topk=0.(4|1) |gather|topk_select" $L/compare.log | head -80; echo "== compare2"; grep -E "^==|cuDNN SDPA  |sparge dense  |FlexAttention 128|sparge kernel 128x128|sparge_attn fp8 topk=0.(4|1) pvthreshd=None" $L/compare2.log | head -40; } > $L/all.txt
cat $L/all.txt
