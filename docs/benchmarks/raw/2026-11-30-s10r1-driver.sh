#!/usr/bin/env bash
# Session 10 round 1 at 42d3425: the block-map + fold suites (verifies the tc16 switch cases and the host-side TMA
# gating), A/B r7 binary vs default vs tc16, profiles, ncu source counters of the select and scores kernels.
TAG=s10r1; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B/bin $B/tests
xz -dc bins/sparge.xz > $B/bin/sparge; xz -dc bins/sparge_old.xz > $B/bin/sparge_old; xz -dc bins/sparge_gpu_tests.xz > $B/tests/sparge_gpu_tests
chmod +x $B/bin/sparge $B/bin/sparge_old $B/tests/sparge_gpu_tests
T=$B/tests/sparge_gpu_tests; S=$B/bin/sparge; O=$B/bin/sparge_old
A="-b=2 -h=32 -s=16384 -d=128 -topk=0.4 -seed=7"
step suite 200 "$T --filter='BLOCKMAP|FOLD_GPU' 2>&1 | grep -vE '^\[ RUN|^\[       OK'"
step ab 110 "for r in 1 2 3; do for v in 'X=0 $O' 'X=0 $S' 'SPARGE_BLOCKMAP_SCORES=tc16 $S'; do for bk in '-blkq=128 -blkk=64' '-blkq=64 -blkk=128'; do echo \"== \$v \$bk\"; env \$v bench $A \$bk 2>&1 | grep -E '^block map|^device copy'; done; done; done"
step prof 25 "for v in X=0 SPARGE_BLOCKMAP_SCORES=tc16; do echo \"== \$v\"; env \$v SPARGE_BLOCKMAP_PROFILE=1 $S bench $A -repeat=3 2>&1 | grep -E 'profile'; done"
step ncu 80 "ncu -k 'regex:select_row_kernel|scores_stage_kernel' --launch-skip 2 --launch-count 2 --section SourceCounters --section LaunchStats --section SpeedOfLight --section Occupancy --section WarpStateStats -o $L/sel -f $S bench $A -warmup=1 -repeat=1 > /dev/null 2>&1; ncu -i $L/sel.ncu-rep --page details 2>&1 | head -300"
step src 30 "ncu -i $L/sel.ncu-rep --page source --csv --print-source=sass > $L/src.csv 2>&1; head -c 600 $L/src.csv; wc -l $L/src.csv"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/suite.log | head -20; grep -B2 -A12 'Failure' $L/suite.log | head -50
cat $L/prof.log
echo "#### ab (ratio block map / copy)"; python3 - $L/ab.log <<'PY'
import sys,re,collections
cur=None; d=collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith('== '): cur=line[3:].strip().replace('/tmp/bb/bin/','')
    m=re.match(r'block map / device copy of Q and K = ([0-9.]+)',line)
    if m and cur: d[cur].append(float(m.group(1)))
    m=re.match(r'block map\s+([0-9.]+)',line)
    if m and cur: d[cur+' ms'].append(float(m.group(1)))
for k,v in d.items(): print(f"{k:62s} {' '.join(f'{x:.3f}' for x in v)}")
PY
grep -E 'select_row|scores_stage|Duration|Executed Ipc A|Registers Per|Achieved Occ|Warp Cycles Per Issued|Issued Warp' $L/ncu.log | head -40
(cd $OUT && tar czf $TAG.tar.gz r && rm -rf r)
