#!/usr/bin/env bash
# Session 12 round 3: union phase B staged ballots; perf fork vs new; gather suite; union profile by region.
TAG=s12r3; BUDGET=${BUDGET:-250}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new; unpack fork $B/fork
T=$B/new; O=$B/fork
step perf 70 "for x in $O $T $O $T; do echo \"== \$x\"; \$x --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\]|gather profile|FAIL' | grep -E 'union_variant=5|gather profile|FAIL'; done"
step ctas 40 "for c in 1 4 2; do echo \"== ctas \$c\"; SPARGE_GATHER_UNION_CTAS=\$c $T --filter='GATHER_GPU_KV_PERF' 2>&1 | grep -E 'perf\\]|gather profile' | grep -B1 -E 'lists=per-kv-head group_union=1 path=default overlap=off union_variant=5' | head -2 | cut -c1-200; done"
step suite 120 "$T --filter='GATHER|COMPACT|TOPK' 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'perf\]|gather profile' "
step ncu 50 "ncu -k regex:union_kernel --launch-skip 40 --launch-count 1 --section SourceCounters --section WarpStateStats --metrics smsp__inst_executed.sum -o $L/un -f $T --filter='GATHER_GPU_KV_PERF' > $L/ncu.out 2>&1; ncu -i $L/un.ncu-rep --page source --csv --print-source=sass > /tmp/un_src.csv 2>&1; python3 drv/ncu_sum.py /tmp/un_src.csv 30 > $L/un_sum.txt 2>&1; ncu -i $L/un.ncu-rep --page details > $L/un_details.txt 2>&1; rm -f $L/un.ncu-rep; echo done"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -8; grep -B2 -A10 'Failure' $L/suite.log | head -40
grep -E '^==|lists=per-kv-head group_union=1 path=default overlap=off' $L/perf.log | sed -E 's/.*median/median/' | cut -c1-200
grep -E 'kv-head' $L/perf.log | grep profile | head -4 | cut -c1-200
cat $L/ctas.log
sed -n '/buckets/,$p' $L/un_sum.txt | head -60; grep -E "inst_executed|Duration" $L/un_details.txt
