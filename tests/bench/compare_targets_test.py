#!/usr/bin/env python3
"""CPU check of bench/compare.py's pure parts (no GPU, no torch: a stub module stands in for it): the --flex-blk
parser and the target summary's pairing of kernel rows (by their LUT's block shape, `blk`) with the FlexAttention
row of the same shape (square shapes, "QxK" shapes, and the block map's own LUT when --flex-blk names its shape), and
the A/B rows' block-pair spread in that summary. Run by ctest (label cpu)."""
import contextlib
import io
import os
import sys
import types

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def load_compare():
    torch = types.ModuleType("torch")
    torch.nn = types.ModuleType("torch.nn")
    torch.nn.functional = types.ModuleType("torch.nn.functional")
    for name, mod in (("torch", torch), ("torch.nn", torch.nn), ("torch.nn.functional", torch.nn.functional)):
        sys.modules.setdefault(name, mod)
    ns = {"__name__": "compare_under_test"}
    path = os.path.join(ROOT, "bench", "compare.py")
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ns)
    return ns


def row(name, kind, ms, topk, **extra):
    return dict({"b": 2, "h": 32, "s": 16384, "d": 128, "causal": False, "dtype": "fp16", "name": name,
                 "kind": kind, "median_ms": ms, "topk": topk}, **extra)


def main():
    c = load_compare()
    assert c["parse_flex_blk"]("128") == [(128, 128)]
    assert c["parse_flex_blk"]("128,128x64") == [(128, 128), (128, 64)]
    assert c["parse_flex_blk"](" 64x128 ") == [(64, 128)]
    assert c["flex_tag"](128, 128) == "128" and c["flex_tag"](128, 64) == "128x64"
    for bad in ("", "x64", "128x", "0", "128x-64", "a"):
        try:
            c["parse_flex_blk"](bad)
        except (ValueError, c["argparse"].ArgumentTypeError):
            continue
        raise AssertionError(f"parse_flex_blk({bad!r}) accepted")

    rows = [
        row("cuDNN SDPA", "dense", 14.0, None),
        row("  sparge kernel topk=0.4", "kernel", 6.0, 0.4, blk="128x64"),
        row("  sparge kernel 128x128 topk=0.4", "kernel128", 6.5, 0.4, blk="128x128"),
        row("  sparge kernel fp8 128x128 topk=0.4", "kernel128_fp8", 5.0, 0.4, blk="128x128"),
        row("  sparge kernel 64x128 topk=0.4", "kernel64x128", 8.0, 0.4, blk="64x128"),
        row("  FlexAttention 128x64 topk=0.4", "flex128x64", 9.0, 0.4),
        row("  FlexAttention 128x128 topk=0.4", "flex128", 8.45, 0.4),
        row("  FlexAttention 64x128 topk=0.4", "flex64x128", 10.0, 0.4),
        row("  sparge kernel topk=0.1", "kernel", 1.7, 0.1),  # no blk: a run without that FlexAttention shape
        row("  FlexAttention 128x64 topk=0.1", "flex128x64", 2.2, 0.1),
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        c["print_targets"](rows, [], [])
    lines = [ln.strip() for ln in out.getvalue().splitlines() if "same LUT" in ln]
    want = [
        "sparge kernel topk=0.4 (128x64) / FlexAttention same LUT, d128 non-causal: 1.50x  (>= 1.40x) PASS",
        "sparge kernel 128x128 topk=0.4 / FlexAttention same LUT, d128 non-causal: 1.30x  (>= 1.40x) FAIL",
        "sparge kernel fp8 128x128 topk=0.4 / FlexAttention same LUT, d128 non-causal: 1.69x  (>= 1.40x) PASS",
        "sparge kernel 64x128 topk=0.4 / FlexAttention same LUT, d128 non-causal: 1.25x  (>= 1.40x) FAIL",
    ]
    assert lines == want, "\n".join(["got:"] + lines + ["want:"] + want)

    # A/B rows: the overall ratio decides; the per-block-pair spread is reported beside it.
    assert c["ratio_spread"]([]) == "n/a"
    assert c["ratio_spread"]([1.41, 1.37, 1.44]) == "1.370..1.440, n = 3"
    ab = [dict(row("sparge kernel 128x128 vs FlexAttention topk=0.4", "ab", None, 0.4), ratio=1.409, rounds=20,
               target=1.4, block_ratios=[1.41, 1.37, 1.44, 1.42]),
          dict(row("sparge dense vs cuDNN SDPA", "ab", None, None), ratio=1.06, rounds=20, target=1.05,
               block_ratios=[1.06, 1.07])]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        c["print_targets"]([], [], ab)
    lines = [ln.strip() for ln in out.getvalue().splitlines() if "interleaved" in ln]
    want = [
        "sparge kernel 128x128 vs FlexAttention topk=0.4, d128 non-causal, interleaved A/B x20: 1.41x  (>= 1.40x) "
        "PASS  [block pairs 1.370..1.440, n = 4, 3 of 4 block pairs]",
        "sparge dense vs cuDNN SDPA, d128 non-causal, interleaved A/B x20: 1.06x  (>= 1.05x) PASS  "
        "[block pairs 1.060..1.070, n = 2, every block pair]",
    ]
    assert lines == want, "\n".join(["got:"] + lines + ["want:"] + want)
    print("compare.py targets: ok")


if __name__ == "__main__":
    main()
