#!/usr/bin/env bash
# Session 15 round 5: dense BENCH base (before varlen) vs new (varlen on sm90) in 4 interleaved pairs, and
# compare.py at HEAD (full: attention, fp8, pv A/B, token section with the one-pass topk).
TAG=s15r5; BUDGET=${BUDGET:-480}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack base $B/base
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step bench 120 "for b in base new base new base new base new; do echo \$b; SPARGE_BENCH=dense $B/\$b --filter='BENCH_ATTENTION' 2>&1 | grep 'BENCH dense'; done"
wait $PB
step compare 260 "cd .. && python3 bench/compare.py --fp8 --pv-ab --token --out $L --tag s15r5"
{ cat $L/summary.txt; tail -2 $L/pybuild.log; cat $L/bench.log; grep -E "^==|cuDNN SDPA  |sparge dense  |FlexAttention 128|sparge kernel 128x128|sparge_attn fp8 topk=0.(4|1) pvthreshd=None|sparge_attn topk=0.(4|1) |gather|topk_select|torch.topk|x torch" $L/compare.log | head -80; } > $L/all.txt
cat $L/all.txt
