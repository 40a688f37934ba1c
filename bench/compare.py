#!/usr/bin/env python3
"""sparge against its peers, in one process, following shared/PERF.md's method.

    PYTHONPATH=python python3 bench/compare.py            # b2 h32 s16384, d 128 and 64, causal and not
    PYTHONPATH=python python3 bench/compare.py --quick    # b1 h8 s4096, a smoke run

Rows per (head dim, causal): torch SDPA with the cuDNN backend and with the flash backend, FlexAttention
(torch.compile'd) dense, sparge dense; then per topk: sparge_attn (prediction included), its block map
alone, sparge's kernel alone on the same LUT, and FlexAttention on the same LUT (a BlockMask built
from it). FlexAttention's tile must divide the mask's block size; its default tile is 128 rows, so the
kernel-only comparison uses LUTs with blkq = blkk = --flex-blk (128 by default) for both.

Timing: warm-up, then the median of --iters CUDA-event timings (min and max reported), fresh random
normal inputs, rotating several input sets when one set fits in L2. FLOPs: dense 4*B*Hq*Sq*Sk*D (exact
causal pair count, about half); sparse counts the attended (query, key) pairs of computed blocks
("useful"), and "TFLOPS" is the dense-equivalent rate. The ratio table is printed last; JSON and PNG
plots go to --out with the date in the file names. Each peer that fails prints "n/a (reason)".
"""

import argparse
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

def time_cuda(fn, input_sets, warmup, iters):
    """Median/min/max milliseconds of fn(*inputs) over CUDA events, rotating the input sets."""
    for i in range(warmup):
        fn(*input_sets[i % len(input_sets)])
    torch.cuda.synchronize()
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


def peer_flex(block_mask):
    flex = flex_fn()
    return lambda q, k, v: flex(q, k, v, block_mask=block_mask)


def checked_sparge(fn):
    """Wraps a sparge call: the output must be a finite CUDA tensor (never a silent CPU fallback)."""
    def run(q, k, v):
        out = fn(q, k, v)
        o = out[0] if isinstance(out, tuple) else out
        if o.device.type != "cuda":
            raise RuntimeError(f"sparge returned a tensor on {o.device}, not on the GPU")
        return out
    return run


# ------------------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.args = args
        self.rows = []

    def add(self, cfg, name, backend, fn, input_sets, flops_dense, flops_useful=None, extra=None):
        row = dict(cfg)
        row.update({"name": name, "backend": backend})
        row.update(extra or {})
        try:
            t = time_cuda(fn, input_sets, self.args.warmup, self.args.iters)
            row.update(t)
            sec = t["median_ms"] * 1e-3
            row["tflops"] = flops_dense / sec / 1e12
            row["useful_tflops"] = (flops_useful if flops_useful is not None else flops_dense) / sec / 1e12
            print(f"  {name:<34} {t['median_ms']:9.3f} ms  [{t['min_ms']:.3f} .. {t['max_ms']:.3f}]  "
                  f"{row['tflops']:7.1f} TFLOPS  ({backend})", flush=True)
        except Exception as e:  # a failing peer must not end the run
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
            row["error"] = reason
            print(f"  {name:<34} n/a ({reason})", flush=True)
            if self.args.verbose:
                traceback.print_exc()
        self.rows.append(row)
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
            print(f"  {'FlexAttention dense':<34} n/a ({type(e).__name__}: {e})"[:200])
    sp_dense = checked_sparge(lambda q, k, v: sparge.dense_attn(q, k, v, is_causal=causal))
    row = bench.add(cfg, "sparge dense", "sparge CUDA dense_attn", sp_dense, sets, fd, extra={"kind": "dense"})
    if "error" not in row and "error" not in cudnn:
        diff = max_diff(sp_dense(q0, k0, v0), peer_sdpa("CUDNN_ATTENTION", causal)(q0, k0, v0))
        row["maxdiff_vs_cudnn"] = diff
        print(f"  {'':<34} max |sparge - cuDNN| = {diff:.2e}{'' if diff < 2e-2 else '  MISMATCH'}")

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
        bench.add(cfg, f"  block map topk={topk}", f"sparge CUDA block_map {args.blkq}x{args.blkk}",
                  checked_sparge(lambda q, k, v: sparge.block_map(
                      q, k, topk=topk, simthreshd1=-0.1, blkq=args.blkq, blkk=args.blkk, is_causal=causal)),
                  sets, 0.0, 0.0, extra=dict(extra, kind="block_map"))
        bench.add(cfg, f"  sparge kernel topk={topk}", f"sparge CUDA block_sparse_attn {args.blkq}x{args.blkk}",
                  checked_sparge(lambda q, k, v: sparge.block_sparse_attn(
                      q, k, v, lut, counts, blkq=args.blkq, blkk=args.blkk, is_causal=causal)),
                  sets, fd, fu, extra=dict(extra, kind="kernel"))

        # Kernel-only against FlexAttention on one LUT of FlexAttention-compatible blocks.
        if args.no_flex:
            continue
        fb = args.flex_blk
        if (fb, fb) == (args.blkq, args.blkk):
            flut, fcounts, fdens, ffu = lut, counts, dens, fu
        else:
            flut, fcounts = sparge.block_map(q0, k0, topk=topk, simthreshd1=-0.1, blkq=fb, blkk=fb, is_causal=causal)
            fdens = sparge.utils.density(fcounts, s, s, fb, fb, causal)
            ffu = sparse_flops(flut, fcounts, s, d, fb, fb, causal)
            bench.add(cfg, f"  sparge kernel {fb}x{fb} topk={topk}", f"sparge CUDA block_sparse_attn {fb}x{fb}",
                      checked_sparge(lambda q, k, v: sparge.block_sparse_attn(
                          q, k, v, flut, fcounts, blkq=fb, blkk=fb, is_causal=causal)),
                      sets, fd, ffu, extra=dict(extra, kind=f"kernel{fb}", density=fdens))
        try:
            bmask = flex_block_mask_from_lut(flut, fcounts, s, fb, fb, causal)
            frow = bench.add(cfg, f"  FlexAttention {fb}x{fb} topk={topk}", "torch.compile flex_attention, same LUT",
                             peer_flex(bmask), sets, fd, ffu, extra=dict(extra, kind=f"flex{fb}", density=fdens))
            if "error" not in frow:
                diff = max_diff(sparge.block_sparse_attn(q0, k0, v0, flut, fcounts, blkq=fb, blkk=fb, is_causal=causal),
                                peer_flex(bmask)(q0, k0, v0))
                frow["maxdiff_vs_sparge"] = diff
                print(f"  {'':<34} max |sparge - flex| on the same LUT = {diff:.2e}"
                      f"{'' if diff < 2e-2 else '  MISMATCH'}")
        except Exception as e:
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
            bench.rows.append(dict(cfg, **extra, name=f"FlexAttention {fb}x{fb} topk={topk}", kind=f"flex{fb}",
                                   error=reason))
            print(f"  {'FlexAttention same LUT':<34} n/a ({reason})")
    del sets, q0, k0, v0
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------
# Report

def fmt_row(r, base_ms):
    if "error" in r:
        return f"{r['name']:<36} n/a ({r['error']})"
    speed = f"{base_ms / r['median_ms']:6.2f}x" if base_ms and r.get("kind") != "block_map" else "      -"
    dens = f"{r['density']:.3f}" if "density" in r else "  -  "
    useful = f"{r['useful_tflops']:7.1f}" if r.get("kind") not in ("block_map",) else "      -"
    tfl = f"{r['tflops']:7.1f}" if r.get("kind") not in ("block_map",) else "      -"
    return (f"{r['name']:<36} {r['median_ms']:9.3f} [{r['min_ms']:8.3f} {r['max_ms']:8.3f}] {tfl} {useful} "
            f"{speed} {dens}  {r['backend']}")


def fill_speedups(rows):
    """speedup_vs_cudnn of every timed row: cuDNN's median over the row's median, same configuration."""
    for r in rows:
        base = next((x for x in rows if x["d"] == r["d"] and x["causal"] == r["causal"]
                     and x["name"] == "cuDNN SDPA" and "median_ms" in x), None)
        if base and "median_ms" in r:
            r["speedup_vs_cudnn"] = base["median_ms"] / r["median_ms"]


def print_table(rows):
    print("\n" + "=" * 150)
    print("Ratio table (speedup = cuDNN SDPA time / time, same run; TFLOPS = dense-equivalent rate; "
          "useful = computed pairs only; density = computed fraction of visible blocks)")
    print(f"{'row':<36} {'median ms':>9} [{'min':>8} {'max':>8}] {'TFLOPS':>7} {'useful':>7} {'speedup':>7} "
          f"{'dens.':>5}  backend")
    configs = []
    for r in rows:
        key = (r["d"], r["causal"])
        if key not in configs:
            configs.append(key)
    for d, causal in configs:
        sub = [r for r in rows if r["d"] == d and r["causal"] == causal]
        base = next((r for r in sub if r["name"] == "cuDNN SDPA" and "error" not in r), None)
        base_ms = base["median_ms"] if base else None
        r0 = sub[0]
        print(f"-- b{r0['b']} h{r0['h']} s{r0['s']} d{d} {r0['dtype']} {'causal' if causal else 'non-causal'}")
        for r in sub:
            print(fmt_row(r, base_ms))


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
                label = {"sparge_attn": "sparge_attn (with prediction)", "kernel": "sparge kernel (given LUT)"}.get(
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
    ap.add_argument("--flex-blk", type=int, default=128, help="block size of the LUT shared with FlexAttention")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes a while)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                                                  "benchmarks"))
    ap.add_argument("--tag", default="", help="appended to the output file names")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failing peers")
    args = ap.parse_args(argv)
    if args.quick:
        args.b, args.h, args.s = 1, 8, 4096
        if args.topk == ap.get_default("topk"):
            args.topk = "1.0,0.4,0.1"
        args.iters = max(10, min(args.iters, 10))
        args.warmup = min(args.warmup, 3)
    args.d = [int(x) for x in args.d.split(",") if x]
    args.topk = [float(x) for x in args.topk.split(",") if x]
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
        "sparge": sparge.__version__, "blkq": args.blkq, "blkk": args.blkk, "flex_blk": args.flex_blk,
        "warmup": args.warmup, "iters": args.iters,
        "method": "median of CUDA-event timings after warm-up; FLOPs 4*B*H*pairs*D (PERF.md)",
    }
    print(f"sparge compare: {props.name}, torch {torch.__version__}, cuDNN {meta['cudnn']}, "
          f"block map {args.blkq}x{args.blkk}, FlexAttention LUT {args.flex_blk}x{args.flex_blk}")

    bench = Bench(args)
    torch.manual_seed(0)
    for d in args.d:
        for causal in causals:
            try:
                run_config(bench, args, d, causal)
            except Exception as e:  # keep the other configurations
                print(f"configuration d{d} causal={causal} failed: {type(e).__name__}: {e}")
                traceback.print_exc()

    os.makedirs(args.out, exist_ok=True)
    fill_speedups(bench.rows)
    json_path = os.path.join(args.out, f"compare_{stamp}.json")
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "rows": bench.rows}, f, indent=1)
    plots = write_plots(bench.rows, args.out, stamp)
    print("\nwrote " + ", ".join([json_path] + plots))
    print_table(bench.rows)  # the table is the last thing printed


if __name__ == "__main__":
    main()
