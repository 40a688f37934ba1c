#!/usr/bin/env bash
# Session 22 round 5: compare.py's token-level section (topk_select vs torch.topk, gather_attn vs the dense kernel
# at the gather shape) at HEAD (row stagger on in every fp16 / bf16 sm90 kernel).
TAG=s22r5; BUDGET=${BUDGET:-400}; source "$(dirname "$0")/common.sh"
step pybuild 300 "cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q ."
step token 200 "cd .. && python3 bench/compare.py --token-only --out $L --tag s22r5"
{ cat $L/summary.txt; tail -3 $L/pybuild.log; sed -n '/token/,$p' $L/token.log | tail -40; } > $L/all.txt
cat $L/all.txt
