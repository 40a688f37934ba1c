#!/usr/bin/env python3
# A model of the K/V ring of attention_ws.cuh (the warp-specialized gather attention kernel), run
# by ctest (test ws_ring_model) and by hand: `python3 src/cuda/gather/ws_ring_model.py` prints "ok N runs" or raises.
# Not the kernel: one process for the producer warpgroup (its 128 threads move in step: their
# copies of a stage are one unit, landing in issue order at random later times), one per consumer
# warpgroup, random interleavings. mbarriers as in PTX (a phase completes at its count; a wait for
# parity P passes once the phase of parity P has completed, so on a fresh barrier a wait for 1
# passes), named barriers as tokens (bar.arrive adds one, bar.sync takes one). Checked: no deadlock,
# every wgmma read finds its step's data landed, no copy lands in a buffer a wgmma may still read
# (between issue and the wait that retires it), the pingpong barriers balanced at exit -- for both
# producer modes (noinc, wait), 2..8 stages, 0..17 steps, 1 or 2 consumer warpgroups, pingpong on
# and off. Mutations that fail it (tried 2026-11-30): the producer waiting for the empty barrier's
# own parity instead of its complement (deadlock), a consumer releasing V before its PV retired
# (WAR), the wait mode arriving the last V before its copies landed (stale read).
# persistent=True (planned in session 12, built in session 27 as attention_ws.cuh's kPersist): tiles in
# sequence, the ring continuing across them, Q in two buffers (tile i in buffer i % 2, gated by that
# buffer's q_empty barrier, which the consumers arrive on after the staged epilogue that writes O
# through it), the pingpong turns opened once by warpgroup 1 and closed once by warpgroup 0, with
# mutations that must fail it (checked at the end of a run). Both walks are one model: the per-tile
# kernel is the walk of one tile without Q. Named barriers are modelled as phases of two members (a
# warpgroup's bar.arrive or bar.sync joins the current phase; bar.sync waits for it to complete), so a
# warpgroup arriving twice in one phase -- which on the hardware completes the phase without the other
# warpgroup -- is an error (mutation 'pp_per_tile': the turns opened and closed at every tile).
import random

class Bar:
    def __init__(s, count): s.count, s.arr, s.ph = count, 0, 0
    def arrive(s, n=1):
        s.arr += n
        assert s.arr <= s.count
        if s.arr == s.count: s.arr, s.ph = 0, s.ph + 1
    def ready(s, parity): return (s.ph & 1) != parity

class Copies:
    """The producer's copies in flight: they land in issue order (conservative: a random number of
    them at each scheduling step), each into its buffer slot, which no reader may hold then, and
    arrive on their barrier (noinc) when they land. `source` (union=True): a copy of tile t reads its
    union keys / mask words from union buffer t % 2 when it lands (cp.async reads its source after
    issue), which must still hold tile t's union then."""
    def __init__(s, rnd): s.rnd, s.pending, s.source = rnd, [], None
    def issue(s, buf, readers, slot, value, bar, what): s.pending.append((buf, readers, slot, value, bar, what))
    def land_some(s):
        while s.pending and s.rnd.random() < 0.5:
            s.land_one()
    def land_one(s):
        buf, readers, slot, value, bar, what = s.pending.pop(0)
        assert readers[slot] == 0, f"WAR: {what} written while read ({value})"
        if s.source is not None and isinstance(value, tuple):
            t = value[0]
            assert s.source[t % 2] == t, f"stale union: {what} of tile {t} read union buffer {t % 2} = tile {s.source[t % 2]}"
        buf[slot] = value
        if bar is not None: bar.arrive()
    def of_tile(s, t):
        return any(isinstance(v, tuple) and v[0] == t for (_, _, _, v, _, _) in s.pending)

# One CTA's walk over the tiles nblks (steps each; the per-tile kernel: one tile, persistent False).
# mode: the producer's 'noinc' or 'wait' completion (the persistent walk is planned with noinc only).
# union=True (session 15, a plan for the fused union of docs/token_sparse.md): the producer builds tile
# i + 1's union into buffer (i + 1) % 2 during tile i (after tile i's first stage), which tile i - 1's
# copies read as their source until they land: before the build it waits until no copy of tile i - 1 is
# in flight (cp.async.wait_all of its own copies in the kernel); mutation 'union_no_wait' skips that.
class NBar:
    """A named barrier of two warpgroups (count 256): each bar.arrive / bar.sync joins the current
    phase, which completes when both have joined; bar.sync then waits for the phase it joined."""
    def __init__(s): s.members, s.ph = [], 0
    def join(s, who):
        assert who not in s.members, f"warpgroup {who} joined a named barrier phase twice"
        s.members.append(who)
        ph = s.ph
        if len(s.members) == 2: s.members, s.ph = [], s.ph + 1
        return ph

def run(stages, nblks, C, mode, pingpong, seed, persistent=False, mutation=None, limit=200000, union=False):
    assert mode == 'noinc' or not persistent
    assert not union or persistent
    rnd = random.Random(seed)
    kf = [Bar(1) for _ in range(stages)]; vf = [Bar(1) for _ in range(stages)]
    ke = [Bar(C) for _ in range(stages)]; ve = [Bar(C) for _ in range(stages)]
    qf, qe = [Bar(1), Bar(1)], [Bar(C), Bar(C)]     # per Q buffer
    kbuf = [None]*stages; vbuf = [None]*stages      # (tile, step) whose data has LANDED
    kread = [0]*stages; vread = [0]*stages          # readers in flight
    qbuf = [None, None]; qread = [0, 0]             # Q buffers: their tile; ldmatrix / epilogue users
    copies = Copies(rnd)
    if union:
        copies.source = [0, None]  # tile 0's union, built before the loop (the kernel's first-tile step)
    nbar = {2: NBar(), 3: NBar()}
    def build_union(t):  # tile t's union into buffer t % 2, once tile t - 2's copies have all landed
        if mutation != 'union_no_wait':
            while copies.of_tile(t - 2): yield
        copies.source[t % 2] = t
    def producer():
        b, phase, bprev = 0, 0, 0
        for i, nblk in enumerate(nblks):
            if union and nblk == 0 and i + 1 < len(nblks):
                yield from build_union(i + 1)
            def load_q():  # persistent: tile i's Q into buffer i % 2, after its q_empty phase of tile i - 2
                qb = i & 1
                if mutation != 'q_no_wait':
                    while not qe[qb].ready(((i >> 1) & 1) ^ 1): yield
                copies.issue(qbuf, qread, qb, i, qf[qb], "Q")
            if persistent:
                yield from load_q()
            for blk in range(nblk):
                while not ke[b].ready(phase ^ 1): yield
                copies.issue(kbuf, kread, b, (i, blk), kf[b] if mode == 'noinc' else None, f"k{b}")
                if mode == 'wait' and blk > 0:
                    # wait_group 1: everything but the newest group (K_blk) landed
                    while len(copies.pending) > 1: yield
                    vf[bprev].arrive()
                if union and blk == 0 and i + 1 < len(nblks):
                    yield from build_union(i + 1)
                while not ve[b].ready(phase ^ 1): yield
                copies.issue(vbuf, vread, b, (i, blk), vf[b] if mode == 'noinc' else None, f"v{b}")
                if mode == 'wait':
                    while len(copies.pending) > 1: yield
                    kf[b].arrive()
                bprev = b
                b += 1
                if b == stages: b, phase = 0, phase ^ 1
                yield
            if mode == 'wait' and nblk > 0:
                while copies.pending: yield
                vf[bprev].arrive()
    def consumer(cw):
        pp = C == 2 and pingpong
        def sync(bar):
            ph = nbar[bar].join(cw)
            while nbar[bar].ph == ph: yield
        def turn_begin():
            if pp: yield from sync(2 + cw)
        def turn_end():
            if pp: nbar[2 + (cw ^ 1)].join(cw)
        def open_turns():
            if pp and cw == 1: nbar[2].join(cw)
        def close_turns():
            if pp and cw == 0: yield from sync(2)
        b, ph = 0, 0  # the ring position of the next step, across tiles
        if mutation != 'pp_per_tile': open_turns()
        for i, nblk in enumerate(nblks):
            if mutation == 'ring_reset': b, ph = 0, 0
            if mutation == 'pp_per_tile': open_turns()
            qb = i & 1
            if persistent:
                while not qf[qb].ready((i >> 1) & 1): yield
                assert qbuf[qb] == i, (qbuf[qb], i)
                qread[qb] += 1; yield                   # ldmatrix of Q into registers
                qread[qb] -= 1
            if nblk > 0:
                while not kf[b].ready(ph): yield
                assert kbuf[b] == (i, 0), (kbuf[b], i)
                yield from turn_begin()
                kread[b] += 1                           # S_0 issued
                turn_end(); yield
                kread[b] -= 1; ke[b].arrive()           # wait<0>, release
                bprev, phprev = b, ph
                b += 1
                if b == stages: b, ph = 0, ph ^ 1
                for blk in range(1, nblk):
                    while not kf[b].ready(ph): yield
                    while not vf[bprev].ready(phprev): yield
                    assert kbuf[b] == (i, blk), (kbuf[b], i, blk)
                    assert vbuf[bprev] == (i, blk - 1)
                    yield from turn_begin()
                    kread[b] += 1; vread[bprev] += 1
                    turn_end(); yield
                    kread[b] -= 1; ke[b].arrive(); yield
                    vread[bprev] -= 1; ve[bprev].arrive()
                    bprev, phprev = b, ph
                    b += 1
                    if b == stages: b, ph = 0, ph ^ 1
                while not vf[bprev].ready(phprev): yield
                assert vbuf[bprev] == (i, nblk - 1)
                yield from turn_begin()
                vread[bprev] += 1
                turn_end(); yield
                vread[bprev] -= 1; ve[bprev].arrive()
            if mutation == 'pp_per_tile': yield from close_turns()
            if not persistent:
                continue
            if mutation == 'q_early_release':
                qe[qb].arrive(); qread[qb] += 1; yield
                qread[qb] -= 1
            else:
                qread[qb] += 1; yield   # the staged epilogue writes through the Q buffer
                qread[qb] -= 1; qe[qb].arrive()
        if mutation != 'pp_per_tile': yield from close_turns()
    procs = [producer()] + [consumer(c) for c in range(C)]
    alive = list(procs); idle = 0
    while alive or copies.pending:
        copies.land_some()
        if not alive: continue
        p = rnd.choice(alive)
        try:
            next(p)
        except StopIteration:
            alive.remove(p)
        idle += 1
        if idle > limit:
            raise RuntimeError(f"deadlock stages={stages} nblks={nblks} C={C} mode={mode} pp={pingpong} persistent={persistent}")
    assert not nbar[2].members and not nbar[3].members, "named barriers unbalanced at exit"

n = 0
for stages in range(2, 9):
    for nblk in [0, 1, 2, 3, 5, 9, 17]:
        for C in (1, 2):
            for mode in ('noinc', 'wait'):
                for pp in (True, False):
                    for seed in range(20):
                        run(stages, [nblk], C, mode, pp, seed); n += 1
print("ok", n, "runs")

m = 0
for stages in range(2, 7):
    for C in (1, 2):
        for pp in (True, False):
            for seed in range(40):
                rnd = random.Random(seed * 131 + stages)
                nblks = [rnd.choice([0, 1, 2, 3, 5, 9]) for _ in range(rnd.randint(1, 5))]
                run(stages, nblks, C, 'noinc', pp, seed, persistent=True, limit=400000); m += 1
print("ok", m, "persistent runs")

u = 0
for stages in range(2, 7):
    for C in (1, 2):
        for seed in range(40):
            rnd = random.Random(seed * 977 + stages)
            nblks = [rnd.choice([0, 1, 2, 3, 5, 9]) for _ in range(rnd.randint(1, 6))]
            run(stages, nblks, C, 'noinc', True, seed, persistent=True, limit=400000, union=True); u += 1
print("ok", u, "persistent runs with the union built in the producer")

# Mutations that must fail: the producer's Q copy without waiting for q_empty, a consumer releasing
# the Q buffer before its staged epilogue, the consumers restarting the ring at every tile, the union
# of tile i + 1 built while copies of tile i - 1 (which read that buffer) are still in flight, the
# pingpong turns opened and closed at every tile (a warpgroup can then arrive twice in one phase).
for mutation in ('q_no_wait', 'q_early_release', 'ring_reset', 'union_no_wait', 'pp_per_tile'):
    failed = 0
    for seed in range(200):
        rnd = random.Random(seed)
        nblks = [rnd.choice([0, 1, 2, 3, 5]) for _ in range(rnd.randint(2, 5))]
        try:
            run(rnd.randint(2, 4), nblks, rnd.choice((1, 2)), 'noinc', True, seed, persistent=True, mutation=mutation,
                limit=400000, union=mutation == 'union_no_wait')
        except (AssertionError, RuntimeError):
            failed += 1
    assert failed > 0, f"the mutation {mutation} was not caught"
    print("mutation", mutation, "caught in", failed, "of 200 runs")
