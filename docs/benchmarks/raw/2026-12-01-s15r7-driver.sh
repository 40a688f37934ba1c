#!/usr/bin/env bash
# Session 15 round 7 (final): compare.py at HEAD (d128 both maskings, topk 1.0 / 0.4 / 0.1, fp8, token section),
# the Python varlen tests on CUDA, and the GPU suite except the token ops (unchanged since s15r2).
TAG=s15r7; BUDGET=${BUDGET:-500}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=8 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
step suite 230 "$B/new --filter='^(?!TOPK|COMPACT|GATHER|BENCH)'"
wait $PB
step pytest 60 "cd ../python && python3 -m pytest -q tests/test_attention.py -k 'varlen' 2>&1 | tail -5"
step compare 170 "cd .. && python3 bench/compare.py --d 128 --topk 1.0,0.4,0.1 --fp8 --token --out $L --tag s15r7"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E "FAILED|Failure" $L/suite.log | head -20; grep -E "tests ran|PASSED  \]|SKIPPED \]" $L/suite.log; cat $L/pytest.log; grep -E "^==|cuDNN SDPA  |sparge dense  |FlexAttention 128|sparge kernel 128x128|sparge_attn fp8 topk=0.(4|1) pvthreshd=None|sparge_attn topk=0.(4|1) |gather union kv-lists swap=0.0 |topk_select|x torch" $L/compare.log | head -40; } > $L/all.txt
cat $L/all.txt
