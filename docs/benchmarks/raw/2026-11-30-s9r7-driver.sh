#!/usr/bin/env bash
# Session 9 final round at HEAD (TMA pooling ring and tensor-core scores tile the defaults): whole GPU suite (seed
# kept), the tool's block map / device copy / device read (3 block sizes, twice), A/B of the new defaults against
# the old paths (POOL=async3, SCORES=fma) x3, memcheck + racecheck on block-map cases, BLOCKMAP_GPU_BENCH
# (s-scaling), ncu L2 hit rate of the two passes without cache flushes.
TAG=s9r7; BUDGET=${BUDGET:-640}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B/bin $B/tests
xz -dc bins/sparge.xz > $B/bin/sparge; xz -dc bins/sparge_gpu_tests.xz > $B/tests/sparge_gpu_tests
chmod +x $B/bin/sparge $B/tests/sparge_gpu_tests
T=$B/tests/sparge_gpu_tests; S=$B/bin/sparge
A="-b=2 -h=32 -s=16384 -d=128 -topk=0.4 -seed=7"
step gpu 300 "$T 2>&1 | grep -vE '^\[ RUN|^\[       OK'"
step toolmap 60 "for r in 1 2; do for bk in '-blkq=128 -blkk=64' '-blkq=64 -blkk=128' '-blkq=64 -blkk=64'; do $S bench $A \$bk 2>&1 | grep -E '^sparge bench|^block map|^device copy|^device read'; done; done"
step ab 70 "for r in 1 2 3; do for v in X=0 SPARGE_BLOCKMAP_POOL=async3 SPARGE_BLOCKMAP_SCORES=fma 'SPARGE_BLOCKMAP_POOL=async3 SPARGE_BLOCKMAP_SCORES=fma'; do echo \"== \$v\"; env \$v $S bench $A 2>&1 | grep -E '^block map|^device copy'; done; done"
step memcheck 60 "compute-sanitizer --tool memcheck --error-exitcode 9 $T --filter='BLOCKMAP.*sq=129,sk=257' 2>&1 | tail -4"
step racecheck 60 "compute-sanitizer --tool racecheck --error-exitcode 9 $T --filter='BLOCKMAP.*sq=129,sk=257' 2>&1 | tail -4"
step bmbench 70 "SPARGE_BENCH=1 $T --filter='BLOCKMAP_GPU_BENCH' 2>&1 | grep -E 'bench \]|FAILED' | head -40"
step ncu 40 "SPARGE_BENCH=1 SPARGE_BLOCKMAP_BENCH_QUICK=1 ncu --cache-control none -k 'regex:pass_kernel' --launch-skip 26 --launch-count 2 --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed $T --filter=BLOCKMAP_GPU_BENCH 2>&1 | grep -E 'pass_kernel|duration|bytes_read|hit_rate|throughput'"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/gpu.log | head -20; grep -B2 -A12 'Failure' $L/gpu.log | head -50
cat $L/toolmap.log; cat $L/memcheck.log $L/racecheck.log; cat $L/bmbench.log; cat $L/ncu.log
echo "#### ab (ratio block map / copy)"; python3 - $L/ab.log <<'PY'
import sys,re,collections
cur=None; d=collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith('== '): cur=line[3:].strip()
    m=re.match(r'block map / device copy of Q and K = ([0-9.]+)',line)
    if m and cur: d[cur].append(float(m.group(1)))
    m=re.match(r'block map\s+([0-9.]+)',line)
    if m and cur: d[cur+' ms'].append(float(m.group(1)))
for k,v in d.items(): print(f"{k:62s} {' '.join(f'{x:.3f}' for x in v)}")
PY
(cd $OUT && tar czf $TAG.tar.gz r && rm -rf r)
