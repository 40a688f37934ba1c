#!/usr/bin/env python3
"""sparge against its peers, in one process, following shared/PERF.md's method.

    PYTHONPATH=python python3 bench/compare.py            # b2 h32 s16384, d 128 and 64, causal and not
    PYTHONPATH=python python3 bench/compare.py --quick    # b1 h8 s4096, a smoke run
    PYTHONPATH=python python3 bench/compare.py --paths --token   # + each attention path, + token level

Rows per (head dim, causal): torch SDPA with the cuDNN backend and with the flash backend, FlexAttention
(torch.compile'd) dense, sparge dense; then per topk: sparge_attn (prediction included), its block map
alone, sparge's kernel alone on the same LUT, and FlexAttention on the same LUT (a BlockMask built
from it). FlexAttention's tile must divide the mask's block size; its default tile is 128 rows, so the
kernel-only comparison uses LUTs of the block shapes --flex-blk names (128 x 128 by default; "128,128x64"
adds sparge's default 128 x 64 map, where FlexAttention is given BLOCK_N = 64 if its default tile does not
divide the mask; 64-row shapes such as 64x128 give it BLOCK_M = 64 the same way) for both.

Timing: warm-up (at least --warmup calls and --warmup-ms of GPU time), then the median of --iters CUDA-event timings (min and max reported), fresh random
normal inputs, rotating several input sets when one set fits in L2. FLOPs: dense 4*B*Hq*Sq*Sk*D (exact
causal pair count, about half); sparse counts the attended (query, key) pairs of computed blocks
("useful"), and "TFLOPS" is the dense-equivalent rate. The ratio table is printed last; JSON and PNG
plots go to --out with the date in the file names. Each peer that fails prints "n/a (reason)".

--paths adds, per configuration, sparge dense and the kernel-only sparse rows at every topk on each
attention path, forced with SPARGE_ATTN_PATH=portable / =sm90 (src/cuda/attention/entry.cu reads it
on every call, so the switch happens in this process): "sparge dense (portable mma.sync)" next to
"flash SDPA (FA2)" (PERF.md: the portable path >= FlashAttention-2 in the same run).

--varlen adds packed sequences (16 mixed lengths, 32762 tokens, hd128): sparge.dense_attn_varlen against
torch's varlen_attn (FlashAttention) and SDPA on a jagged nested tensor, non-causal and causal, with the
max difference to each peer.

--token adds the token-level section (PERF.md): sparge.topk_select against torch.topk on 512 x 131072
fp32 and fp16 scores, k = 2048 (index sets checked row by row), and sparge.gather_attn at hd128,
2048 keys per row, lists shared by GQA groups of 64 positions (each row swapping a fraction of its
group's keys), with and without group_union, its TFLOPS counted on attended keys next to sparge's
dense TFLOPS measured in the same run, and the measured union overlap. --token-only skips the
attention configurations. A target summary (PERF.md, same-run ratios) is printed after the table.
"""

import argparse
import contextlib
import datetime
import json
import math
import os
import statistics
import sys
import traceback

import torch
import torch.nn.functional as F

L2_BYTES = 60 * 1024 * 1024


# ------------------------------------------------------------------------------------------------
# Timing

def warm_up(fns, input_sets, calls, ms):
    """At least `calls` calls of each fn (in turn), and until `ms` milliseconds of GPU time have passed
    (measured around the calls with CUDA events, checked after each round): a short kernel timed right
    after host-side work (a LUT built, a compile) otherwise starts on the clocks of an idle GPU. Session
    17 saw sparge's 1.6 ms kernel at 1.94 ms in its own row and 1.63 ms in the alternated A/B after 5
    calls of warm-up. The same rule for every row and both sides of an A/B (triton's do_bench also
    warms up by time)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    i = 0
    while True:
        for fn in fns:
            fn(*input_sets[i % len(input_sets)])
        i += 1
        end.record()
        end.synchronize()
        if i >= calls and start.elapsed_time(end) >= ms:
            break
    torch.cuda.synchronize()


def time_cuda(fn, input_sets, warmup, iters, warmup_ms=0.0):
    """Median/min/max milliseconds of fn(*inputs) over CUDA events, rotating the input sets."""
    warm_up([fn], input_sets, warmup, warmup_ms)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        args = input_sets[i % len(input_sets)]
        starts[i].record()
        fn(*args)
        ends[i].record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "runs": len(ms)}


def time_ab(fa, fb, input_sets, warmup, rounds, block=5, settle=2, warmup_ms=0.0, settle_ms=0.0):
    """Medians of fa and fb timed in alternating blocks, A B B A A B ...: each block runs `settle`
    untimed calls, then `block` timed ones (CUDA events per call), so each peer is timed near its own
    steady clock, while drift over the run (temperature) falls on both. Single calls alternated A B A B
    were tried first (session 16, s16r2) and measure each peer partly under the other's power state:
    the follower of a power-hungrier kernel starts on lower clocks. Session 18: the settle calls also last
    at least settle_ms of GPU time (--settle-ms), since 2 calls of a 1.6 ms kernel left the previous
    peer's clocks in the block: the A/B and the rows disagreed by up to 10% on the short kernels.
    Returns the two medians and, per pair of neighbouring blocks (block i of fa, block i of fb), the ratio
    of their medians (fa / fb): the spread of the ratio within the run (session 25)."""
    warm_up([fa, fb], input_sets, warmup, warmup_ms)
    blocks = max(2, (rounds + block - 1) // block)
    times = {0: [], 1: []}
    block_medians = {0: [], 1: []}
    for i in range(blocks):
        for which in ((0, 1) if i % 2 == 0 else (1, 0)):
            fn = fa if which == 0 else fb
            warm_up([fn], input_sets, settle, settle_ms)
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(block)]
            for j, (e0, e1) in enumerate(ev):
                args = input_sets[j % len(input_sets)]
                e0.record()
                fn(*args)
                e1.record()
            torch.cuda.synchronize()
            t = [e0.elapsed_time(e1) for e0, e1 in ev]
            times[which] += t
            block_medians[which].append(statistics.median(t))
    pair_ratios = [a / b for a, b in zip(block_medians[0], block_medians[1])]
    return statistics.median(times[0]), statistics.median(times[1]), pair_ratios


def ratio_spread(pairs):
    """'lo..hi, n = N' of the A/B's per-block-pair ratios (time_ab)."""
    if not pairs:
        return "n/a"
    return f"{min(pairs):.3f}..{max(pairs):.3f}, n = {len(pairs)}"


def make_input_sets(b, h, s, d, dtype, n_max_sets=4):
    one_set = 3 * b * h * s * d * torch.finfo(dtype).bits // 8
    n = 1 if one_set > L2_BYTES else min(n_max_sets, max(2, math.ceil(3 * L2_BYTES / one_set)))
    sets = []
    for _ in range(n):
        sets.append(tuple(torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3)))
    return sets


# ------------------------------------------------------------------------------------------------
# FLOPs

def pair_counts(s, blkq, blkk, causal, device):
    """[NQ, NK] number of attended (query, key) pairs inside each block (Sq = Sk = s)."""
    nq, nk = (s + blkq - 1) // blkq, (s + blkk - 1) // blkk
    rows = torch.arange(nq, device=device) * blkq
    cols = torch.arange(nk, device=device) * blkk
    rlen = (torch.clamp(rows + blkq, max=s) - rows).double()
    clen = (torch.clamp(cols + blkk, max=s) - cols).double()
    if not causal:
        return rlen[:, None] * clen[None, :]
    # Sum over rows i of the block of |{j in block : j <= i}|.
    i = torch.arange(s, device=device)
    per_row = torch.clamp(i[:, None] - cols[None, :] + 1, min=0).double()
    per_row = torch.minimum(per_row, clen[None, :])
    out = torch.zeros(nq, nk, dtype=torch.float64, device=device)
    out.index_add_(0, i // blkq, per_row)
    return out


def dense_flops(b, h, s, d, causal):
    pairs = s * (s + 1) / 2 if causal else s * s
    return 4.0 * b * h * d * pairs


def sparse_flops(lut, counts, s, d, blkq, blkk, causal):
    import sparge.utils as su
    bm = su.block_mask_from_lut(lut, counts)
    pairs = pair_counts(s, blkq, blkk, causal, lut.device)
    return 4.0 * d * float((bm.double() * pairs).sum().item())


# ------------------------------------------------------------------------------------------------
# Peers. Each returns a callable taking (q, k, v) in HND layout.

def peer_sdpa(backend_name, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v):
        # sdpa_kernel with a single backend raises instead of falling back to another one.
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


_flex_compiled = None


def flex_fn():
    global _flex_compiled
    if _flex_compiled is None:
        from torch.nn.attention.flex_attention import flex_attention
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    return _flex_compiled


def causal_mask_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def flex_tag(fq, fk):
    """The kind suffix of a FlexAttention block shape: "128" for 128 x 128 (the former single option), "128x64"."""
    return str(fq) if fq == fk else f"{fq}x{fk}"


def parse_flex_blk(text):
    """--flex-blk: comma-separated block shapes, each "N" (N x N) or "QxK"."""
    shapes = []
    for item in text.split(","):
        q, sep, k = item.strip().partition("x")
        if not q.isdigit() or (sep and not k.isdigit()) or int(q) <= 0 or (sep and int(k) <= 0):
            raise argparse.ArgumentTypeError(f"--flex-blk: {item.strip()!r} is not N or QxK (positive integers)")
        shapes.append((int(q), int(k) if sep else int(q)))
    return shapes


def flex_block_mask_from_lut(lut, counts, s, blkq, blkk, causal):
    """A BlockMask with exactly the LUT's blocks: blocks wholly below the diagonal are 'full' (no
    mask_mod call), diagonal blocks of a causal run are 'partial' (mask_mod masks per token)."""
    from torch.nn.attention.flex_attention import BlockMask
    import sparge.utils as su
    bm = su.block_mask_from_lut(lut, counts)
    nq, nk = bm.shape[-2:]
    if causal:
        first_row = torch.arange(nq, device=bm.device) * blkq
        last_col = torch.clamp((torch.arange(nk, device=bm.device) + 1) * blkk, max=s) - 1
        whole = last_col[None, :] <= first_row[:, None]
    else:
        whole = torch.ones(nq, nk, dtype=torch.bool, device=bm.device)
    full_lut, full_cnt = su.lut_from_block_mask(bm & whole)
    part_lut, part_cnt = su.lut_from_block_mask(bm & ~whole)
    return BlockMask.from_kv_blocks(
        part_cnt, part_lut.clamp(min=0), full_cnt, full_lut.clamp(min=0), BLOCK_SIZE=(blkq, blkk),
        mask_mod=causal_mask_mod if causal else None, seq_lengths=(s, s))


def peer_flex(block_mask, kernel_options=None):
    flex = flex_fn()
    return lambda q, k, v: flex(q, k, v, block_mask=block_mask, kernel_options=kernel_options)


def checked_sparge(fn):
    """Wraps a sparge call: the output must be a finite CUDA tensor (never a silent CPU fallback)."""
    def run(*args):
        out = fn(*args)
        o = out[0] if isinstance(out, tuple) else out
        if o.device.type != "cuda":
            raise RuntimeError(f"sparge returned a tensor on {o.device}, not on the GPU")
        return out
    return run


# ------------------------------------------------------------------------------------------------

def reason_of(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]


@contextlib.contextmanager
def attn_path(path):
    """Forces sparge's attention path (None: the automatic selection) for the calls inside; the C++
    dispatcher reads SPARGE_ATTN_PATH on every call (os.environ writes through to the C environment)."""
    old = os.environ.get("SPARGE_ATTN_PATH")
    if path is None:
        os.environ.pop("SPARGE_ATTN_PATH", None)
    else:
        os.environ["SPARGE_ATTN_PATH"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SPARGE_ATTN_PATH", None)
        else:
            os.environ["SPARGE_ATTN_PATH"] = old


# The paths of --paths: (SPARGE_ATTN_PATH value, row label).
PATHS = (("portable", "portable mma.sync"), ("sm90", "sm90 wgmma"))


class Bench:
    def __init__(self, args):
        self.args = args
        self.rows = []
        self.token_rows = []
        self.varlen_rows = []
        self.ab_rows = []

    def time_into(self, row, fn, input_sets, work, unit="TFLOPS", useful=None):
        """Times fn into row (median/min/max, rate = work / median in `unit`); a failure becomes
        row["error"] and prints n/a (reason)."""
        name, backend = row["name"], row.get("backend", "")
        try:
            t = time_cuda(fn, input_sets, self.args.warmup, self.args.iters, self.args.warmup_ms)
            row.update(t)
            sec = t["median_ms"] * 1e-3
            scale = 1e12 if unit == "TFLOPS" else 1e9
            rate = work / sec / scale
            if unit == "TFLOPS":
                row["tflops"] = rate
                row["useful_tflops"] = (useful if useful is not None else work) / sec / 1e12
            else:
                row["rate"], row["unit"] = rate, unit
            print(f"  {name:<42} {t['median_ms']:9.3f} ms  [{t['min_ms']:.3f} .. {t['max_ms']:.3f}]  "
                  f"{rate:7.1f} {unit}  ({backend})", flush=True)
        except Exception as e:  # a failing peer must not end the run
            row["error"] = reason_of(e)
            print(f"  {name:<42} n/a ({row['error']})", flush=True)
            if self.args.verbose:
                traceback.print_exc()
        return row

    def add(self, cfg, name, backend, fn, input_sets, flops_dense, flops_useful=None, extra=None):
        row = dict(cfg)
        row.update({"name": name, "backend": backend})
        row.update(extra or {})
        self.time_into(row, fn, input_sets, flops_dense, "TFLOPS", flops_useful)
        self.rows.append(row)
        return row

    def add_ab(self, cfg, name, peer, fa, fb, input_sets, target, extra=None):
        """--ab: the peer (fa) and sparge (fb) timed in alternation; the row keeps both medians and
        ratio = peer / sparge."""
        if not self.args.ab:
            return None
        row = dict(cfg)
        row.update({"name": name, "kind": "ab", "peer": peer, "target": target})
        row.update(extra or {})
        try:
            ma, mb, pairs = time_ab(fa, fb, input_sets, self.args.warmup, self.args.ab, warmup_ms=self.args.warmup_ms,
                                    settle_ms=self.args.settle_ms)
            row.update({"peer_ms": ma, "sparge_ms": mb, "ratio": ma / mb, "rounds": self.args.ab,
                        "block_ratios": pairs})
            print(f"  {name:<42} A/B x{self.args.ab}: {peer} {ma:.3f} ms, sparge {mb:.3f} ms, "
                  f"ratio {ma / mb:.3f} (block pairs {ratio_spread(pairs)})", flush=True)
        except Exception as e:
            row["error"] = reason_of(e)
            print(f"  {name:<42} A/B n/a ({row['error']})", flush=True)
        self.ab_rows.append(row)
        return row

    def add_token(self, name, backend, fn, input_sets, work, unit, extra=None):
        row = {"section": "token", "name": name, "backend": backend}
        row.update(extra or {})
        self.time_into(row, fn, input_sets, work, unit)
        self.token_rows.append(row)
        return row

    def fail_token(self, name, e, extra=None):
        row = {"section": "token", "name": name, "error": reason_of(e)}
        row.update(extra or {})
        print(f"  {name:<42} n/a ({row['error']})", flush=True)
        if self.args.verbose:
            traceback.print_exc()
        self.token_rows.append(row)
        return row


def max_diff(a, b):
    a = a[0] if isinstance(a, tuple) else a
    b = b[0] if isinstance(b, tuple) else b
    return (a.float() - b.float()).abs().max().item()


def run_config(bench, args, d, causal):
    import sparge
    b, h, s = args.b, args.h, args.s
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    cfg = {"b": b, "h": h, "s": s, "d": d, "causal": causal, "dtype": args.dtype}
    print(f"\n== b{b} h{h} s{s} d{d} {args.dtype} {'causal' if causal else 'non-causal'}", flush=True)
    sets = make_input_sets(b, h, s, d, dtype)
    q0, k0, v0 = sets[0]
    fd = dense_flops(b, h, s, d, causal)

    # Dense peers.
    cudnn = bench.add(cfg, "cuDNN SDPA", "torch SDPBackend.CUDNN_ATTENTION", peer_sdpa("CUDNN_ATTENTION", causal),
                      sets, fd, extra={"kind": "dense"})
    bench.add(cfg, "flash SDPA (FA2)", "torch SDPBackend.FLASH_ATTENTION", peer_sdpa("FLASH_ATTENTION", causal),
              sets, fd, extra={"kind": "dense"})
    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask
            dense_bm = create_block_mask(causal_mask_mod, None, None, s, s) if causal else None
            bench.add(cfg, "FlexAttention dense", "torch.compile flex_attention (triton)", peer_flex(dense_bm),
                      sets, fd, extra={"kind": "dense"})
        except Exception as e:
            bench.rows.append(dict(cfg, name="FlexAttention dense", error=f"{type(e).__name__}: {e}"[:160]))
            print(f"  {'FlexAttention dense':<42} n/a ({type(e).__name__}: {e})"[:200])
    sp_dense = checked_sparge(lambda q, k, v: sparge.dense_attn(q, k, v, is_causal=causal))
    row = bench.add(cfg, "sparge dense", "sparge CUDA dense_attn", sp_dense, sets, fd, extra={"kind": "dense"})
    if "error" not in row and "error" not in cudnn:
        diff = max_diff(sp_dense(q0, k0, v0), peer_sdpa("CUDNN_ATTENTION", causal)(q0, k0, v0))
        row["maxdiff_vs_cudnn"] = diff
        print(f"  {'':<42} max |sparge - cuDNN| = {diff:.2e}{'' if diff < 2e-2 else '  MISMATCH'}")
    if "error" not in row and "error" not in cudnn:
        bench.add_ab(cfg, "sparge dense vs cuDNN SDPA", "cuDNN", peer_sdpa("CUDNN_ATTENTION", causal), sp_dense,
                     sets, 1.05 if d == 128 and not causal else 1.0)
    if args.paths:
        for path, label in PATHS:
            with attn_path(path):
                prow = bench.add(cfg, f"sparge dense ({label})", f"sparge CUDA dense_attn, SPARGE_ATTN_PATH={path}",
                                 sp_dense, sets, fd, extra={"kind": "dense", "path": path})
                if "error" not in prow and "error" not in cudnn:
                    try:
                        diff = max_diff(sp_dense(q0, k0, v0), peer_sdpa("CUDNN_ATTENTION", causal)(q0, k0, v0))
                        prow["maxdiff_vs_cudnn"] = diff
                        print(f"  {'':<42} max |sparge - cuDNN| = {diff:.2e}{'' if diff < 2e-2 else '  MISMATCH'}")
                    except Exception as e:
                        print(f"  {'':<42} max |sparge - cuDNN| n/a ({reason_of(e)})")

    # Sparse rows per topk.
    for topk in args.topk:
        extra = {"topk": topk}
        try:
            lut, counts = sparge.block_map(q0, k0, topk=topk, simthreshd1=-0.1, blkq=args.blkq, blkk=args.blkk,
                                           is_causal=causal)
            dens = sparge.utils.density(counts, s, s, args.blkq, args.blkk, causal)
            fu = sparse_flops(lut, counts, s, d, args.blkq, args.blkk, causal)
        except Exception as e:
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
            print(f"  topk {topk}: sparge block map n/a ({reason})")
            bench.rows.append(dict(cfg, name=f"sparge_attn topk={topk}", kind="sparge_attn", topk=topk, error=reason))
            continue
        extra["density"] = dens
        print(f"  -- topk {topk}: density {dens:.3f} of visible blocks (LUT {args.blkq}x{args.blkk})")
        bench.add(cfg, f"sparge_attn topk={topk}", f"sparge CUDA block_map+block_sparse_attn {args.blkq}x{args.blkk}",
                  checked_sparge(lambda q, k, v: sparge.sparge_attn(
                      q, k, v, topk=topk, is_causal=causal, blkq=args.blkq, blkk=args.blkk)),
                  sets, fd, fu, extra=dict(extra, kind="sparge_attn"))
        if args.pv_ab:
            # sparge_attn's default pvthreshd=50 against none (the kernel's pv_threshold vote path costs time).
            bench.add(cfg, f"sparge_attn topk={topk} pvthreshd=None", f"sparge CUDA block_map+block_sparse_attn "
                      f"{args.blkq}x{args.blkk}, no pv_threshold",
                      checked_sparge(lambda q, k, v: sparge.sparge_attn(
                          q, k, v, topk=topk, pvthreshd=None, is_causal=causal, blkq=args.blkq, blkk=args.blkk)),
                      sets, fd, fu, extra=dict(extra, kind="sparge_attn_nopv"))
        bench.add(cfg, f"  block map topk={topk}", f"sparge CUDA block_map {args.blkq}x{args.blkk}",
                  checked_sparge(lambda q, k, v: sparge.block_map(
                      q, k, topk=topk, simthreshd1=-0.1, blkq=args.blkq, blkk=args.blkk, is_causal=causal)),
                  sets, 0.0, 0.0, extra=dict(extra, kind="block_map"))
        bench.add(cfg, f"  sparge kernel topk={topk}", f"sparge CUDA block_sparse_attn {args.blkq}x{args.blkk}",
                  checked_sparge(lambda q, k, v: sparge.block_sparse_attn(
                      q, k, v, lut, counts, blkq=args.blkq, blkk=args.blkk, is_causal=causal)),
                  sets, fd, fu, extra=dict(extra, kind="kernel", blk=f"{args.blkq}x{args.blkk}"))
        if args.fp8:
            # The fp8 recipe (docs/quantized.md): prepass + fp8 kernel; with the prediction, and alone.
            bench.add(cfg, f"sparge_attn fp8 topk={topk}", f"sparge block_map + block_sparse_attn recipe fp8 "
                      f"{args.blkq}x{args.blkk}",
                      checked_sparge(lambda q, k, v: sparge.sparge_attn(
                          q, k, v, topk=topk, is_causal=causal, blkq=args.blkq, blkk=args.blkk, recipe="fp8")),
                      sets, fd, fu, extra=dict(extra, kind="sparge_attn_fp8"))
            if args.pv_ab:
                bench.add(cfg, f"sparge_attn fp8 topk={topk} pvthreshd=None", f"sparge block_map + block_sparse_attn "
                          f"recipe fp8 {args.blkq}x{args.blkk}, no pv_threshold",
                          checked_sparge(lambda q, k, v: sparge.sparge_attn(
                              q, k, v, topk=topk, pvthreshd=None, is_causal=causal, blkq=args.blkq, blkk=args.blkk,
                              recipe="fp8")),
                          sets, fd, fu, extra=dict(extra, kind="sparge_attn_fp8_nopv"))
            frow8 = bench.add(cfg, f"  sparge kernel fp8 topk={topk}", f"sparge block_sparse_attn recipe fp8 "
                              f"{args.blkq}x{args.blkk} (prepass included)",
                              checked_sparge(lambda q, k, v: sparge.block_sparse_attn(
                                  q, k, v, lut, counts, blkq=args.blkq, blkk=args.blkk, is_causal=causal,
                                  recipe="fp8")),
                              sets, fd, fu, extra=dict(extra, kind="kernel_fp8"))
            if "error" not in frow8:
                diff = max_diff(sparge.block_sparse_attn(q0, k0, v0, lut, counts, blkq=args.blkq, blkk=args.blkk,
                                                         is_causal=causal, recipe="fp8"),
                                sparge.block_sparse_attn(q0, k0, v0, lut, counts, blkq=args.blkq, blkk=args.blkk,
                                                         is_causal=causal))
                frow8["maxdiff_vs_fp16"] = diff
                print(f"  {'':<42} max |fp8 - fp16 kernel| on the same LUT = {diff:.2e}")
        if args.paths:
            for path, label in PATHS:
                with attn_path(path):
                    bench.add(cfg, f"  sparge kernel ({label}) topk={topk}",
                              f"sparge CUDA block_sparse_attn {args.blkq}x{args.blkk}, SPARGE_ATTN_PATH={path}",
                              checked_sparge(lambda q, k, v: sparge.block_sparse_attn(
                                  q, k, v, lut, counts, blkq=args.blkq, blkk=args.blkk, is_causal=causal)),
                              sets, fd, fu, extra=dict(extra, kind=f"kernel_{path}", path=path))

        # Kernel-only against FlexAttention on LUTs of FlexAttention-compatible blocks (--flex-blk: one or more
        # block shapes; each gets its own LUT from the block map, the same for both, and an A/B pair).
        if args.no_flex:
            continue
        for fq, fk in args.flex_blk:
            ft = flex_tag(fq, fk)
            if (fq, fk) == (args.blkq, args.blkk):
                flut, fcounts, fdens, ffu = lut, counts, dens, fu
            else:
                flut, fcounts = sparge.block_map(q0, k0, topk=topk, simthreshd1=-0.1, blkq=fq, blkk=fk, is_causal=causal)
                fdens = sparge.utils.density(fcounts, s, s, fq, fk, causal)
                ffu = sparse_flops(flut, fcounts, s, d, fq, fk, causal)
                bench.add(cfg, f"  sparge kernel {fq}x{fk} topk={topk}", f"sparge CUDA block_sparse_attn {fq}x{fk}",
                          checked_sparge(lambda q, k, v: sparge.block_sparse_attn(
                              q, k, v, flut, fcounts, blkq=fq, blkk=fk, is_causal=causal)),
                          sets, fd, ffu, extra=dict(extra, kind=f"kernel{ft}", blk=f"{fq}x{fk}", density=fdens))
                if args.fp8:
                    bench.add(cfg, f"  sparge kernel fp8 {fq}x{fk} topk={topk}",
                              f"sparge block_sparse_attn recipe fp8 {fq}x{fk} (prepass included)",
                              checked_sparge(lambda q, k, v: sparge.block_sparse_attn(
                                  q, k, v, flut, fcounts, blkq=fq, blkk=fk, is_causal=causal, recipe="fp8")),
                              sets, fd, ffu, extra=dict(extra, kind=f"kernel{ft}_fp8", blk=f"{fq}x{fk}",
                                                        density=fdens))
            try:
                bmask = flex_block_mask_from_lut(flut, fcounts, s, fq, fk, causal)
                fopts = None
                frow = bench.add(cfg, f"  FlexAttention {fq}x{fk} topk={topk}", "torch.compile flex_attention, same LUT",
                                 peer_flex(bmask), sets, fd, ffu, extra=dict(extra, kind=f"flex{ft}", density=fdens))
                if "error" in frow and (fq < 128 or fk < 128):
                    # Its default tile does not divide the mask's blocks: the tile of the mask's size on the side(s)
                    # below 128 (query blocks of 64 rows need BLOCK_M = 64; not yet run on the H200, session 25).
                    bench.rows.remove(frow)
                    fopts = {}
                    if fq < 128:
                        fopts["BLOCK_M"] = fq
                    if fk < 128:
                        fopts["BLOCK_N"] = fk
                    frow = bench.add(cfg, f"  FlexAttention {fq}x{fk} topk={topk}",
                                     f"torch.compile flex_attention, same LUT, kernel_options {fopts}",
                                     peer_flex(bmask, fopts), sets, fd, ffu,
                                     extra=dict(extra, kind=f"flex{ft}", density=fdens))
                if "error" not in frow:
                    diff = max_diff(sparge.block_sparse_attn(q0, k0, v0, flut, fcounts, blkq=fq, blkk=fk, is_causal=causal),
                                    peer_flex(bmask, fopts)(q0, k0, v0))
                    frow["maxdiff_vs_sparge"] = diff
                    print(f"  {'':<42} max |sparge - flex| on the same LUT = {diff:.2e}"
                          f"{'' if diff < 2e-2 else '  MISMATCH'}")
                    bench.add_ab(cfg, f"sparge kernel {fq}x{fk} vs FlexAttention topk={topk}", "FlexAttention",
                                 peer_flex(bmask, fopts), checked_sparge(lambda q, k, v: sparge.block_sparse_attn(
                                     q, k, v, flut, fcounts, blkq=fq, blkk=fk, is_causal=causal)),
                                 sets, 1.4, extra=dict(extra, density=fdens, flex_blk=ft))
            except Exception as e:
                reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
                bench.rows.append(dict(cfg, **extra, name=f"FlexAttention {fq}x{fk} topk={topk}", kind=f"flex{ft}",
                                       error=reason))
                print(f"  {'FlexAttention same LUT':<42} n/a ({reason})")
    del sets, q0, k0, v0
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------
# Token level (--token)

def check_topk(scores, k, sp_out, torch_out):
    """Row-by-row check of sparge.topk_select against torch.topk: a dict of counts and a verdict.
    Index sets must be equal, except where torch.topk broke a tie at the k-th value differently
    (then the selected value multisets must still be equal)."""
    idx_s, cnt_s = sp_out
    val_t, idx_t = torch_out
    idx_s = idx_s.long()
    rows = scores.shape[0]
    in_range = bool(((idx_s >= 0) & (idx_s < scores.shape[-1])).all().item())
    a = idx_s.sort(-1).values
    b = idx_t.sort(-1).values
    same = (a == b).all(-1)
    dups = int((a[:, 1:] == a[:, :-1]).any(-1).sum().item())
    va = scores.gather(-1, idx_s.clamp(min=0)).float().sort(-1).values
    vb = val_t.float().sort(-1).values
    vals = (va == vb).all(-1)
    res = {"rows": rows, "sets_equal_rows": int(same.sum().item()),
           "tie_only_rows": int((~same & vals).sum().item()), "bad_rows": int((~same & ~vals).sum().item()),
           "duplicate_rows": dups, "counts_ok": bool((cnt_s == k).all().item()), "in_range": in_range}
    res["ok"] = res["bad_rows"] == 0 and dups == 0 and res["counts_ok"] and in_range
    return res


def gather_lists(b, hq, hk, sq, sk, n, group_pos, swap, device):
    """[b, hq, sq, n] int32 key lists: one random base set of n distinct keys per (batch, kv head,
    group_pos consecutive positions), shared by the kv head's query heads; each row replaces each
    entry with probability `swap` by a key outside the base (distinct within the row), then its
    order is shuffled (the kernel must not assume sorted lists). Also returns the group of each row."""
    if n > sk or (swap > 0 and 2 * n > sk):
        raise ValueError(f"gather lists need sk >= keys, and sk >= 2 * keys to swap (sk = {sk}, keys = {n})")
    grp, nblk = hq // hk, (sq + group_pos - 1) // group_pos
    ng = b * hk * nblk
    perm = torch.rand(ng, sk, device=device).argsort(-1)
    base, rest = perm[:, :n], perm[:, n:]
    g = ((torch.arange(b, device=device)[:, None, None] * hk + torch.arange(hq, device=device)[None, :, None] // grp)
         * nblk + torch.arange(sq, device=device)[None, None, :] // group_pos)
    lists = base[g]
    if swap > 0:
        off = torch.randint(0, sk - n, (b, hq, sq, 1), device=device)
        repl = rest[g[..., None], (off + torch.arange(n, device=device)) % (sk - n)]
        lists = torch.where(torch.rand(b, hq, sq, n, device=device) < swap, repl, lists)
        del repl, off
    lists = lists.gather(-1, torch.rand(b, hq, sq, n, device=device).argsort(-1))
    return lists.to(torch.int32).contiguous(), g, ng


def union_overlap(lists, g, ng, sk):
    """Union size / sum of list sizes over the groups (every list full)."""
    seen = torch.zeros(ng, sk, dtype=torch.bool, device=lists.device)
    seen[g[..., None].expand(lists.shape), lists.long()] = True
    return float(seen.sum().item()) / lists.numel()


def gather_reference_diff(out, q, k, v, lists, rows, scale):
    """max |out - fp32 reference| on the first `rows` positions of batch 0, query head 0."""
    keys = k[0, 0][lists[0, 0, :rows].long()].float()
    vals = v[0, 0][lists[0, 0, :rows].long()].float()
    logits = (q[0, 0, :rows, None, :].float() * keys).sum(-1) * scale
    ref = (torch.softmax(logits, -1)[..., None] * vals).sum(-2)
    return (out[0, 0, :rows].float() - ref).abs().max().item()


# PERF.md's token-level shapes: topk_select rows x scores; gather_attn problem; the dense reference
# timed when the attention section has no fp16 d128 non-causal sparge dense row (quick, full).
# Varlen: 16 sequences of mixed lengths (32762 tokens, about b2 s16384's), as tests/gpu BENCH's varlen rows.
VARLEN_LENS = (6144, 4096, 4096, 3072, 2048, 2048, 2048, 1536, 1500, 1024, 1024, 1000, 777, 513, 300, 1536)


def run_varlen(bench, args):
    """Packed sequences: sparge.dense_attn_varlen against torch's varlen_attn (FlashAttention) and SDPA on a
    jagged nested tensor, non-causal and causal, at head dim 128; TFLOPS on each sequence's own pairs."""
    import sparge
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    h, d, lens = args.h, 128, VARLEN_LENS
    total, mx = sum(lens), max(lens)
    print(f"\n== varlen: {len(lens)} sequences, {total} tokens (max {mx}), h{h} d{d} {args.dtype}", flush=True)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=dtype) for _ in range(3))
    sets = [(q, k, v)]
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    offsets = cu.to(torch.int64)

    def jagged(t):  # (B, H, j, D) nested view of a packed [T, H, D] tensor
        return torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2)

    for causal in (False, True):
        pairs = sum(l * (l + 1) / 2 if causal else l * l for l in lens)
        work = 4.0 * h * d * pairs
        extra = {"section": "varlen", "causal": causal, "seqs": len(lens), "tokens": total, "h": h, "d": d,
                 "dtype": args.dtype}
        rows = {}
        tag = "causal" if causal else "non-causal"

        def add(name, backend, fn):
            row = {"name": f"{name} {tag}", "backend": backend, **extra}
            bench.time_into(row, fn, sets, work, "TFLOPS")
            bench.varlen_rows.append(row)
            rows[name] = (row, fn)

        sp = checked_sparge(lambda q_, k_, v_: sparge.dense_attn_varlen(q_, k_, v_, cu, cu, mx, mx, is_causal=causal))
        add("sparge dense_attn_varlen", "sparge CUDA dense_attn_varlen", sp)
        if varlen_attn is not None:
            win = (-1, 0) if causal else (-1, -1)
            add("torch varlen_attn", "torch.nn.attention.varlen.varlen_attn (FlashAttention)",
                lambda q_, k_, v_: varlen_attn(q_, k_, v_, cu, cu, mx, mx, window_size=win))
        else:
            bench.varlen_rows.append({"name": f"torch varlen_attn {tag}", "error": "not in this torch", **extra})
            print(f"  {'torch varlen_attn ' + tag:<42} n/a (not in this torch)")
        add("SDPA jagged nested", "torch SDPA on nested_tensor_from_jagged (default backend)",
            lambda q_, k_, v_: F.scaled_dot_product_attention(jagged(q_), jagged(k_), jagged(v_), is_causal=causal))
        base = rows.get("sparge dense_attn_varlen")
        for name in ("torch varlen_attn", "SDPA jagged nested"):
            peer = rows.get(name)
            if base is None or peer is None or "error" in base[0] or "error" in peer[0]:
                continue
            base[0][f"speedup_vs_{name.replace(' ', '_')}"] = peer[0]["median_ms"] / base[0]["median_ms"]
            try:
                o_p = peer[1](q, k, v)
                o_p = o_p.transpose(1, 2).values() if o_p.is_nested else o_p
                diff = (base[1](q, k, v).float() - o_p.float()).abs().max().item()
                base[0][f"maxdiff_vs_{name.replace(' ', '_')}"] = diff
                print(f"  {'':<42} {peer[0]['median_ms'] / base[0]['median_ms']:.2f}x {name}; max |sparge - peer| = "
                      f"{diff:.2e}{'' if diff < 2e-2 else '  MISMATCH'}")
            except Exception as e:
                print(f"  {'':<42} check vs {name} n/a ({reason_of(e)})")


TOPK_SHAPE = (512, 131072)
GATHER_SHAPE = {"b": 1, "hq": 32, "hk": 8, "sq": 1024, "sk": 16384, "d": 128}
DENSE_REF_SHAPE = ((1, 8, 4096), (2, 32, 16384))


def run_token(bench, args):
    import sparge
    k_sel, (n_rows, n_cols) = args.token_k, TOPK_SHAPE
    print(f"\n== token level: topk_select {n_rows} x {n_cols}, k = {k_sel}", flush=True)
    for dname, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        extra = {"kind": "topk", "dtype": dname, "rows": n_rows, "n": n_cols, "k": k_sel}
        try:
            scores = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
        except Exception as e:
            bench.fail_token(f"topk {dname} inputs", e, extra)
            continue
        sets = [(scores,)]
        nbytes = scores.numel() * scores.element_size()
        sp = bench.add_token(f"sparge topk_select {dname}", "sparge CUDA topk_select (radix select)",
                             checked_sparge(lambda x: sparge.topk_select(x, k_sel)), sets, nbytes,
                             "GB/s", extra=dict(extra, impl="sparge"))
        tt = bench.add_token(f"torch.topk {dname}", "torch.topk(dim=-1)", lambda x: torch.topk(x, k_sel, dim=-1),
                             sets, nbytes, "GB/s", extra=dict(extra, impl="torch"))
        if "error" not in sp and "error" not in tt:
            sp["speedup_vs_torch_topk"] = tt["median_ms"] / sp["median_ms"]
            try:
                chk = check_topk(scores, k_sel, sparge.topk_select(scores, k_sel), torch.topk(scores, k_sel, dim=-1))
                sp["check"] = chk
                print(f"  {'':<42} {sp['speedup_vs_torch_topk']:.2f}x torch.topk; index sets equal in "
                      f"{chk['sets_equal_rows']}/{chk['rows']} rows, {chk['tie_only_rows']} differ only in ties "
                      f"at the k-th value, {chk['bad_rows']} wrong{'' if chk['ok'] else '  MISMATCH'}")
            except Exception as e:
                sp["check"] = {"ok": False, "error": reason_of(e)}
                print(f"  {'':<42} check n/a ({reason_of(e)})")
        del scores, sets
        torch.cuda.empty_cache()

    b, hq, hk, sq, sk, d = (GATHER_SHAPE[x] for x in ("b", "hq", "hk", "sq", "sk", "d"))
    n = args.token_k
    dtype = torch.float16
    print(f"\n== token level: gather_attn b{b} hq{hq} hk{hk} sq{sq} sk{sk} d{d} fp16, {n} keys per row, "
          f"lists shared per kv head x {args.union_rows} positions", flush=True)
    try:
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
        k = torch.randn(b, hk, sk, d, device="cuda", dtype=dtype)
        v = torch.randn(b, hk, sk, d, device="cuda", dtype=dtype)
    except Exception as e:
        bench.fail_token("gather inputs", e, {"kind": "gather"})
        return
    shape = {"b": b, "hq": hq, "hk": hk, "sq": sq, "sk": sk, "d": d, "dtype": "fp16"}
    bench.add_token("sparge dense (gather shape)", "sparge CUDA dense_attn, GQA", checked_sparge(
        lambda q_, k_, v_: sparge.dense_attn(q_, k_, v_)), [(q, k, v)], 4.0 * b * hq * sq * sk * d, "TFLOPS",
        extra=dict(shape, kind="dense"))
    have_main = any(r["name"] == "sparge dense" and r["d"] == 128 and not r["causal"] and "error" not in r
                    for r in bench.rows)
    if not have_main:  # the dense reference at PERF.md's shape when the attention section did not run it
        try:
            rb, rh, rs = DENSE_REF_SHAPE[0 if args.quick else 1]
            rsets = make_input_sets(rb, rh, rs, d, dtype)
            bench.add_token(f"sparge dense b{rb} h{rh} s{rs} d{d}", "sparge CUDA dense_attn", checked_sparge(
                lambda q_, k_, v_: sparge.dense_attn(q_, k_, v_)), rsets, dense_flops(rb, rh, rs, d, False),
                "TFLOPS", extra={"kind": "dense", "b": rb, "hq": rh, "hk": rh, "sq": rs, "sk": rs, "d": d,
                                 "dtype": "fp16"})
            del rsets
        except Exception as e:
            bench.fail_token("sparge dense reference", e, {"kind": "dense"})
    for swap in args.token_swap:
        extra = dict(shape, kind="gather", keys=n, union_rows=args.union_rows, swap=swap)
        try:
            lists, g, ng = gather_lists(b, hq, hk, sq, sk, n, args.union_rows, swap, q.device)
            counts = torch.full((b, hq, sq), n, dtype=torch.int32, device=q.device)
            overlap = union_overlap(lists, g, ng, sk)
            # One list per kv head (NSA / DSA-style): indices [b, hk, sq, n], query head h reads list
            # h // (hq // hk); here the list of each group's first query head (swap 0: the same
            # attention as the per-query-head lists, whose heads of a group are identical).
            lists_kv = lists[:, ::hq // hk].contiguous()
            counts_kv = torch.full((b, hk, sq), n, dtype=torch.int32, device=q.device)
            overlap_kv = union_overlap(lists_kv, g[:, ::hq // hk], ng, sk)
            del g
        except Exception as e:
            bench.fail_token(f"gather lists swap={swap}", e, extra)
            continue
        extra["union_overlap"] = overlap
        print(f"  -- swap {swap}: union overlap (union / sum of lists per group) = {overlap:.4f}")
        flops = 4.0 * d * float(counts.sum(dtype=torch.float64).item())  # non-causal: every listed key attended

        def time_layout(tag, note, lists_, counts_, flops_, extra_, same_as=None):
            # Per-row and union gather_attn on one list layout, each checked against the fp32
            # reference and, with same_as (the other layout's outputs, swap 0), bitwise against it.
            outs_ = {}
            for uni in (False, True):
                row = bench.add_token(
                    f"gather {'union' if uni else 'per-row'}{tag} swap={swap}",
                    f"sparge CUDA gather_attn group_union={uni} union_rows={args.union_rows}{note}",
                    checked_sparge(lambda q_, k_, v_: sparge.gather_attn(q_, k_, v_, lists_, counts_, group_union=uni,
                                                                         union_rows=args.union_rows)),
                    [(q, k, v)], flops_, "TFLOPS", extra=dict(extra_, group_union=uni))
                if "error" in row:
                    continue
                try:
                    outs_[uni] = sparge.gather_attn(q, k, v, lists_, counts_, group_union=uni,
                                                    union_rows=args.union_rows)
                    row["maxdiff_vs_reference"] = gather_reference_diff(outs_[uni], q, k, v, lists_, 128, d ** -0.5)
                    print(f"  {'':<42} max |gather - fp32 reference| (128 rows) = {row['maxdiff_vs_reference']:.2e}"
                          f"{'' if row['maxdiff_vs_reference'] < 2e-2 else '  MISMATCH'}")
                    if same_as is not None and uni in same_as:  # identical lists in a group: the same attention
                        same = torch.equal(outs_[uni], same_as[uni])
                        print(f"  {'':<42} kv-lists == per-q-head lists bitwise: {same}{'' if same else '  MISMATCH'}")
                except Exception as e:
                    print(f"  {'':<42} reference check n/a ({reason_of(e)})")
            return outs_

        outs = time_layout("", "", lists, counts, flops, extra)
        if len(outs) == 2:
            diff = max_diff(outs[False], outs[True])
            print(f"  {'':<42} max |union - per-row| = {diff:.2e}{'' if diff < 2e-2 else '  MISMATCH'}")
        print(f"  -- swap {swap}, lists per kv head [b, hk, sq, n]: union overlap (union / sum of the group's "
              f"{args.union_rows} lists) = {overlap_kv:.4f}")
        flops_kv = 4.0 * d * n * b * hq * sq  # every query head attends its kv head's full list
        outs_kv = time_layout(" kv-lists", ", indices [b, hk, sq, n]", lists_kv, counts_kv, flops_kv,
                              dict(extra, lists="per kv head", union_overlap=overlap_kv),
                              same_as=outs if swap == 0 else None)
        del lists, counts, outs, lists_kv, counts_kv, outs_kv
        torch.cuda.empty_cache()
    del q, k, v
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------
# Report

def fmt_row(r, base_ms, fa2_ms=None):
    if "error" in r:
        return f"{r['name']:<44} n/a ({r['error']})"
    speed = f"{base_ms / r['median_ms']:6.2f}x" if base_ms and r.get("kind") != "block_map" else "      -"
    vs_fa2 = f"{fa2_ms / r['median_ms']:6.2f}x" if fa2_ms and r.get("kind") == "dense" else "      -"
    dens = f"{r['density']:.3f}" if "density" in r else "  -  "
    useful = f"{r['useful_tflops']:7.1f}" if r.get("kind") not in ("block_map",) else "      -"
    tfl = f"{r['tflops']:7.1f}" if r.get("kind") not in ("block_map",) else "      -"
    return (f"{r['name']:<44} {r['median_ms']:9.3f} [{r['min_ms']:8.3f} {r['max_ms']:8.3f}] {tfl} {useful} "
            f"{speed} {vs_fa2} {dens}  {r['backend']}")


def find_row(rows, name, **keys):
    """The first timed row called name whose fields match keys, or None."""
    return next((r for r in rows if r["name"] == name and "median_ms" in r
                 and all(r.get(k) == v for k, v in keys.items())), None)


def fill_speedups(rows):
    """speedup_vs_cudnn of every timed row: cuDNN's median over the row's median, same configuration."""
    for r in rows:
        base = next((x for x in rows if x["d"] == r["d"] and x["causal"] == r["causal"]
                     and x["name"] == "cuDNN SDPA" and "median_ms" in x), None)
        if base and "median_ms" in r:
            r["speedup_vs_cudnn"] = base["median_ms"] / r["median_ms"]


def print_table(rows):
    print("\n" + "=" * 160)
    print("Ratio table (speedup = cuDNN SDPA time / time, same run; vs FA2 = flash SDPA time / time, dense rows; "
          "TFLOPS = dense-equivalent rate; useful = computed pairs only; density = computed fraction of visible "
          "blocks)")
    print(f"{'row':<44} {'median ms':>9} [{'min':>8} {'max':>8}] {'TFLOPS':>7} {'useful':>7} {'speedup':>7} "
          f"{'vs FA2':>7} {'dens.':>5}  backend")
    configs = []
    for r in rows:
        key = (r["d"], r["causal"])
        if key not in configs:
            configs.append(key)
    for d, causal in configs:
        sub = [r for r in rows if r["d"] == d and r["causal"] == causal]
        base = next((r for r in sub if r["name"] == "cuDNN SDPA" and "error" not in r), None)
        base_ms = base["median_ms"] if base else None
        fa2 = find_row(sub, "flash SDPA (FA2)")
        r0 = sub[0]
        print(f"-- b{r0['b']} h{r0['h']} s{r0['s']} d{d} {r0['dtype']} {'causal' if causal else 'non-causal'}")
        for r in sub:
            print(fmt_row(r, base_ms, fa2["median_ms"] if fa2 else None))


def dense_reference_tflops(rows, token_rows):
    """The highest sparge dense TFLOPS (automatic path, fp16 d128 non-causal) measured in this run:
    the attention section's row and the token section's own dense rows."""
    cands = [r for r in rows if r["name"] == "sparge dense" and r.get("d") == 128 and not r.get("causal")
             and r.get("dtype") == "fp16" and "tflops" in r]
    cands += [r for r in token_rows if r.get("kind") == "dense" and "tflops" in r]
    return max(cands, key=lambda r: r["tflops"], default=None)


def print_token_table(token_rows, rows):
    if not token_rows:
        return
    print("\nToken level (same run; topk: GB/s = one read of the scores, speedup = torch.topk time / time; "
          "gather: TFLOPS on attended keys, % of the best sparge dense TFLOPS of this run)")
    ref = dense_reference_tflops(rows, token_rows)
    for r in token_rows:
        if "error" in r:
            print(f"{r['name']:<44} n/a ({r['error']})")
            continue
        rate = f"{r['rate']:7.1f} {r['unit']:<6}" if "rate" in r else f"{r['tflops']:7.1f} TFLOPS"
        note = ""
        if r.get("kind") == "topk" and "speedup_vs_torch_topk" in r:
            chk = r.get("check", {})
            note = (f"{r['speedup_vs_torch_topk']:5.2f}x torch.topk, check "
                    f"{'ok' if chk.get('ok') else 'FAILED ' + str(chk)}")
        elif r.get("kind") == "gather":
            pct = f"{100 * r['tflops'] / ref['tflops']:5.1f}% of dense" if ref else "dense n/a"
            note = f"{pct}, union overlap {r['union_overlap']:.4f}"
        print(f"{r['name']:<44} {r['median_ms']:9.3f} [{r['min_ms']:8.3f} {r['max_ms']:8.3f}] {rate} {note}")
    if ref:
        print(f"(dense reference: {ref['name']}, {ref['tflops']:.1f} TFLOPS)")


def verdict(value, target):
    return "n/a" if value is None else ("PASS" if value >= target else "FAIL")


def print_targets(rows, token_rows, ab_rows=()):
    """PERF.md targets that this run can decide, as same-run ratios."""
    lines = []
    configs = []
    for r in rows:
        if (r["d"], r["causal"]) not in configs:
            configs.append((r["d"], r["causal"]))
    for d, causal in configs:
        sub = [r for r in rows if r["d"] == d and r["causal"] == causal]
        tag = f"d{d} {'causal' if causal else 'non-causal'}"
        fa2, cudnn = find_row(sub, "flash SDPA (FA2)"), find_row(sub, "cuDNN SDPA")
        portable = find_row(sub, "sparge dense (portable mma.sync)")
        if any(r["name"] == "sparge dense (portable mma.sync)" for r in sub):
            x = fa2["median_ms"] / portable["median_ms"] if fa2 and portable else None
            lines.append(f"portable dense / FA2, {tag}: " + (f"{x:.2f}x" if x else "n/a") + f"  (>= 1.00x) {verdict(x, 1.0)}")
        for name in ("sparge dense", "sparge dense (sm90 wgmma)"):
            r = find_row(sub, name)
            if r and cudnn:
                x = cudnn["median_ms"] / r["median_ms"]
                want = 1.05 if d == 128 and not causal else 1.0
                lines.append(f"{name} / cuDNN, {tag}: {x:.2f}x  (>= {want:.2f}x) {verdict(x, want)}")
        # Sparse with the prediction (fp16 and the fp8 recipe) against cuDNN dense; kernels on the
        # FlexAttention LUT against FlexAttention.
        for r in sub:
            topk = r.get("topk")
            with_map = ("sparge_attn", "sparge_attn_fp8", "sparge_attn_nopv", "sparge_attn_fp8_nopv")
            if r.get("kind") in with_map and cudnn and "median_ms" in r and topk in (0.4, 0.1):
                x = cudnn["median_ms"] / r["median_ms"]
                want = 2.5 if topk == 0.4 else 8.5
                lines.append(f"{r['name']} / cuDNN dense, {tag}: {x:.2f}x  (>= {want:.1f}x) {verdict(x, want)}")
            kind = r.get("kind", "")
            # Kernel rows carry their LUT's block shape (blk "QxK": the block map's own LUT and each --flex-blk
            # LUT), which names FlexAttention's row on the same LUT when --flex-blk has that shape.
            shape = r.get("blk")
            if shape and "median_ms" in r:
                flex = find_row(sub, f"  FlexAttention {shape} topk={topk}")
                if flex and "median_ms" in flex and topk in (0.4, 0.1):
                    x = flex["median_ms"] / r["median_ms"]
                    label = r["name"].strip() + (f" ({shape})" if kind == "kernel" else "")
                    lines.append(f"{label} / FlexAttention same LUT, {tag}: {x:.2f}x  (>= 1.40x) {verdict(x, 1.4)}")
    for r in ab_rows:
        if "ratio" in r and (r.get("topk") in (None, 0.4, 0.1)):
            tag = f"d{r['d']} {'causal' if r['causal'] else 'non-causal'}"
            pairs = r.get("block_ratios") or []
            every = "" if not pairs else (", every block pair" if min(pairs) >= r["target"] else
                                          f", {sum(x >= r['target'] for x in pairs)} of {len(pairs)} block pairs")
            lines.append(f"{r['name']}, {tag}, interleaved A/B x{r['rounds']}: {r['ratio']:.2f}x  "
                         f"(>= {r['target']:.2f}x) {verdict(r['ratio'], r['target'])}"
                         f"  [block pairs {ratio_spread(pairs)}{every}]")
    for r in token_rows:
        if r.get("kind") == "topk" and r.get("impl") == "sparge":
            x = r.get("speedup_vs_torch_topk")
            ok = r.get("check", {}).get("ok", False)
            lines.append(f"topk_select {r['dtype']} / torch.topk: " + (f"{x:.2f}x" if x else "n/a")
                         + f"  (>= 3.00x) {verdict(x, 3.0)}{'' if ok else ', results NOT checked equal'}")
    ref = dense_reference_tflops(rows, token_rows)
    for r in token_rows:
        if r.get("kind") == "gather":
            x = r["tflops"] / ref["tflops"] if ref and "tflops" in r else None
            lines.append(f"{r['name']} / dense TFLOPS: " + (f"{100 * x:.1f}%" if x is not None else "n/a")
                         + f"  (>= 60%) {verdict(x, 0.6)}")
    if lines:
        print("\nTargets (shared/PERF.md, ratios of this run)")
        for line in lines:
            print("  " + line)


def write_plots(rows, out_dir, stamp):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed")
        return []
    configs = sorted({(r["d"], r["causal"]) for r in rows}, key=lambda c: (-c[0], c[1]))
    paths = []

    # Speedup over cuDNN vs topk.
    fig, axes = plt.subplots(1, len(configs), figsize=(5 * len(configs), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], configs):
        sub = [r for r in rows if r["d"] == d and r["causal"] == causal and "speedup_vs_cudnn" in r]
        kinds = sorted({r["kind"] for r in sub if "topk" in r and r["kind"] != "block_map"})
        for kind in kinds:
            pts = sorted((r["topk"], r["speedup_vs_cudnn"]) for r in sub if r.get("kind") == kind and "topk" in r)
            if pts:
                label = {"sparge_attn": "sparge_attn (with prediction)", "kernel": "sparge kernel (given LUT)",
                         "kernel_portable": "sparge kernel, portable path", "kernel_sm90": "sparge kernel, sm90 path"}.get(
                    kind, kind.replace("kernel", "sparge kernel ").replace("flex", "FlexAttention "))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        dense_styles = iter([":", "--", "-.", (0, (1, 4))])
        for r in sub:
            if r.get("kind") == "dense":
                ax.axhline(r["speedup_vs_cudnn"], linestyle=next(dense_styles, ":"), linewidth=1, color="gray",
                           label=f"{r['name']} (dense)")
        r0 = rows[0]
        ax.set_title(f"b{r0['b']} h{r0['h']} s{r0['s']} d{d} {r0['dtype']} {'causal' if causal else 'non-causal'}",
                     fontsize=9)
        ax.set_xlabel("topk")
        ax.set_ylabel("speedup over cuDNN SDPA (same run)")
        ax.invert_xaxis()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    p = os.path.join(out_dir, f"compare_speedup_{stamp}.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)

    # Block map stacked on attention, per topk.
    fig, axes = plt.subplots(1, len(configs), figsize=(5 * len(configs), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], configs):
        sub = [r for r in rows if r["d"] == d and r["causal"] == causal and "median_ms" in r]
        topks = sorted({r["topk"] for r in sub if "topk" in r}, reverse=True)
        bm = [next((r["median_ms"] for r in sub if r.get("kind") == "block_map" and r["topk"] == t), 0.0)
              for t in topks]
        at = [next((r["median_ms"] for r in sub if r.get("kind") == "kernel" and r["topk"] == t), 0.0)
              for t in topks]
        tot = [next((r["median_ms"] for r in sub if r.get("kind") == "sparge_attn" and r["topk"] == t), None)
               for t in topks]
        x = list(range(len(topks)))
        ax.bar(x, at, label="attention (block_sparse_attn)")
        ax.bar(x, bm, bottom=at, label="block map")
        ax.scatter([i for i, t in zip(x, tot) if t], [t for t in tot if t], color="black", marker="_", s=200,
                   label="sparge_attn total", zorder=3)
        for i in x:
            total = bm[i] + at[i]
            if total > 0:
                ax.annotate(f"{100 * bm[i] / total:.0f}%", (i, total), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [str(t) for t in topks])
        ax.set_xlabel("topk")
        ax.set_ylabel("ms")
        ax.set_title(f"d{d} {'causal' if causal else 'non-causal'}: block map share", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    p = os.path.join(out_dir, f"compare_blockmap_{stamp}.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    return paths


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="b1 h8 s4096, topk 1.0/0.4/0.1, fewer runs")
    ap.add_argument("--b", type=int, default=2)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--s", type=int, default=16384)
    ap.add_argument("--d", type=str, default="128,64", help="head dims, comma-separated")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    ap.add_argument("--topk", type=str, default="1.0,0.5,0.4,0.2,0.1")
    ap.add_argument("--blkq", type=int, default=None, help="block map Q block (default sparge.DEFAULT_BLKQ)")
    ap.add_argument("--blkk", type=int, default=None, help="block map K block (default sparge.DEFAULT_BLKK)")
    ap.add_argument("--flex-blk", type=parse_flex_blk, default=[(128, 128)],
                    help="block shapes of the LUTs shared with FlexAttention, comma-separated, each N (N x N) or QxK "
                         "(default 128)")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes a while)")
    ap.add_argument("--fp8", action="store_true",
                    help="also time the fp8 recipe (sparge_attn and the kernel with recipe='fp8', prepass included)")
    ap.add_argument("--pv-ab", action="store_true",
                    help="also time sparge_attn with pvthreshd=None (fp16, and fp8 with --fp8) next to the default 50")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--warmup-ms", type=float, default=200.0,
                    help="warm-up also lasts at least this many milliseconds of GPU time (every row alike)")
    ap.add_argument("--settle-ms", type=float, default=50.0,
                    help="--ab: each block's untimed calls last at least this many milliseconds of GPU time")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                                                  "benchmarks"))
    ap.add_argument("--tag", default="", help="appended to the output file names")
    ap.add_argument("--paths", action="store_true",
                    help="also time sparge dense and the kernel-only sparse rows on each attention path "
                         "(SPARGE_ATTN_PATH=portable and =sm90)")
    ap.add_argument("--token", action="store_true",
                    help="also run the token-level section (topk_select vs torch.topk, gather_attn)")
    ap.add_argument("--token-only", action="store_true", help="only the token-level section")
    ap.add_argument("--token-k", type=int, default=2048, help="k of topk_select, keys per row of gather_attn")
    ap.add_argument("--token-swap", type=str, default="0.0,0.01,0.1",
                    help="fractions of its group's keys each gather row replaces, comma-separated")
    ap.add_argument("--union-rows", type=int, default=64, help="positions per gather_attn group (union_rows)")
    ap.add_argument("--varlen", action="store_true",
                    help="also run the varlen section (packed sequences: sparge.dense_attn_varlen vs torch's "
                         "varlen_attn and SDPA on a jagged nested tensor)")
    ap.add_argument("--ab", type=int, default=0, metavar="N",
                    help="also time the acceptance pairs (cuDNN vs sparge dense, FlexAttention vs the sparge kernel "
                         "on its LUT) in alternating blocks of 5 calls (A B B A ...), about N timed calls each, "
                         "and print those ratios too")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failing peers")
    args = ap.parse_args(argv)
    if args.quick:
        args.b, args.h, args.s = 1, 8, 4096
        if args.topk == ap.get_default("topk"):
            args.topk = "1.0,0.4,0.1"
        args.iters = max(10, min(args.iters, 10))
        args.warmup = min(args.warmup, 3)
        args.warmup_ms = min(args.warmup_ms, 20.0)
        args.settle_ms = min(args.settle_ms, 10.0)
    args.d = [int(x) for x in args.d.split(",") if x]
    args.topk = [float(x) for x in args.topk.split(",") if x]
    args.token_swap = [float(x) for x in args.token_swap.split(",") if x]
    args.token = args.token or args.token_only
    args.iters = max(args.iters, 10)  # PERF.md: the median of >= 10 timed runs
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench/compare.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    try:
        import sparge
    except ImportError as e:
        sys.exit(f"bench/compare.py: {e}")
    if not sparge.cuda_available():
        sys.exit("bench/compare.py: this sparge extension has no CUDA backend (built_with_cuda = "
                 f"{sparge.built_with_cuda()}); rebuild with SPARGE_CUDA=on python3 python/setup.py build_ext --inplace")
    args.blkq = args.blkq or sparge.DEFAULT_BLKQ
    args.blkk = args.blkk or sparge.DEFAULT_BLKK
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]

    props = torch.cuda.get_device_properties(0)
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d") + (f"_{args.tag}" if args.tag else "")
    meta = {
        "date": now.isoformat(timespec="seconds"), "device": props.name, "sms": props.multi_processor_count,
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "sparge": sparge.__version__, "blkq": args.blkq, "blkk": args.blkk, "flex_blk": [flex_tag(q, k) for q, k in args.flex_blk],
        "warmup": args.warmup, "warmup_ms": args.warmup_ms, "settle_ms": args.settle_ms, "iters": args.iters, "paths": args.paths, "token": args.token,
        "SPARGE_ATTN_PATH": os.environ.get("SPARGE_ATTN_PATH"),
        "method": "median of CUDA-event timings after warm-up; FLOPs 4*B*H*pairs*D (PERF.md)",
    }
    print(f"sparge compare: {props.name}, torch {torch.__version__}, cuDNN {meta['cudnn']}, "
          f"block map {args.blkq}x{args.blkk}, FlexAttention LUT "
          f"{', '.join(f'{q}x{k}' for q, k in args.flex_blk)}")

    bench = Bench(args)
    torch.manual_seed(0)
    if os.environ.get("SPARGE_ATTN_PATH"):
        print(f"note: SPARGE_ATTN_PATH={os.environ['SPARGE_ATTN_PATH']} is set: the plain sparge rows use that path")
    for d in ([] if args.token_only else args.d):
        for causal in causals:
            try:
                run_config(bench, args, d, causal)
            except Exception as e:  # keep the other configurations
                print(f"configuration d{d} causal={causal} failed: {type(e).__name__}: {e}")
                traceback.print_exc()
    for wanted, section, label in ((args.varlen, run_varlen, "varlen"), (args.token, run_token, "token-level")):
        if not wanted:
            continue
        try:
            section(bench, args)
        except Exception as e:  # keep the rest of the run
            print(f"{label} section failed: {reason_of(e)}")
            traceback.print_exc()

    os.makedirs(args.out, exist_ok=True)
    fill_speedups(bench.rows)
    json_path = os.path.join(args.out, f"compare_{stamp}.json")
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "rows": bench.rows, "token_rows": bench.token_rows, "varlen_rows": bench.varlen_rows,
                   "ab_rows": bench.ab_rows},
                  f, indent=1)
    plots = []
    if bench.rows:
        try:
            plots = write_plots(bench.rows, args.out, stamp)
        except Exception as e:
            print(f"plots failed: {reason_of(e)}")
    print("\nwrote " + ", ".join([json_path] + plots))
    if bench.rows:
        print_table(bench.rows)  # the table, the token table and the targets are the last things printed
    print_token_table(bench.token_rows, bench.rows)
    print_targets(bench.rows, bench.token_rows, bench.ab_rows)


if __name__ == "__main__":
    main()
