"""Block-sparse, SpargeAttn end-to-end, dense attention and LSE merging against float64 references.

Every device in ref.devices() runs: the CPU backend always, the CUDA backend when it is built and a
GPU is visible (otherwise those cases are skipped, never failed).
"""

import itertools

import pytest
import torch

import sparge
from sparge import utils
from ref import (assert_close_to_ref, assert_lse_close, devices, randn_qkv, ref_attention, sdpa_baseline,
                 to_hnd)

DEVICES = devices()


def _dtypes(device):
    return [torch.float16, torch.bfloat16] + ([torch.float32] if device == "cpu" else [])


def _cases():
    """(device, dtype, d, causal, layout, shape) with GQA, block sizes and lengths varied across cases."""
    shapes = [  # b, hq, hk, sq, sk, blkq, blkk
        (1, 2, 2, 113, 203, 64, 64),
        (2, 4, 2, 256, 256, 64, 128),
        (1, 4, 1, 200, 130, 128, 64),  # Sq > Sk: causal leaves the first rows empty
        (1, 2, 1, 320, 384, 128, 128),
    ]
    out = []
    for device in ["cpu", "cuda"]:
        for i, (dtype, d, causal, layout) in enumerate(
                itertools.product([torch.float16, torch.bfloat16, torch.float32], [64, 128], [False, True],
                                  ["HND", "NHD"])):
            if device == "cuda" and dtype == torch.float32:
                continue
            shape = shapes[(i + i // 4) % len(shapes)]  # every (causal, layout) pair meets every shape
            out.append(pytest.param(device, dtype, d, causal, layout, shape,
                                    id=f"{device}-{str(dtype)[6:]}-d{d}-{'causal' if causal else 'full'}-{layout}-"
                                       f"s{shape[3]}x{shape[4]}"))
    return out


def _skip_unless(device):
    if device not in DEVICES:
        pytest.skip(f"{device}: no CUDA device or sparge built without CUDA")


def _random_lut(b, h, sq, sk, blkq, blkk, density, gen, device):
    nq, nk = utils.num_blocks(sq, blkq), utils.num_blocks(sk, blkk)
    bm = torch.rand(b, h, nq, nk, generator=gen) < density
    bm[:, 0, 1] = False  # an empty LUT row in every batch
    bm[0, -1, 0] = True  # and a full one
    lut, counts = utils.lut_from_block_mask(bm)
    return lut.to(device), counts.to(device)


@pytest.mark.parametrize("device,dtype,d,causal,layout,shape", _cases())
def test_block_sparse_attn_matches_masked_reference(device, dtype, d, causal, layout, shape):
    _skip_unless(device)
    b, hq, hk, sq, sk, blkq, blkk = shape
    gen = torch.Generator().manual_seed(hash((str(dtype), d, causal, layout, sq)) % 2**31)
    q, k, v = randn_qkv(b, hq, hk, sq, sk, d, dtype, device, layout, gen)
    lut, counts = _random_lut(b, hq, sq, sk, blkq, blkk, 0.5, gen, device)

    o, lse = sparge.block_sparse_attn(q, k, v, lut, counts, blkq=blkq, blkk=blkk, is_causal=causal,
                                      tensor_layout=layout, return_lse=True)
    assert o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32

    mask = utils.token_mask_from_lut(lut, counts, sq, sk, blkq, blkk, causal)
    qh, kh, vh = (to_hnd(t, layout) for t in (q, k, v))
    ref_o, ref_lse = ref_attention(qh, kh, vh, mask)
    base = sdpa_baseline(qh, kh, vh, mask)
    assert_close_to_ref(to_hnd(o, layout), ref_o, base, "block_sparse_attn")
    assert_lse_close(lse, ref_lse, dtype, "block_sparse_attn")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_block_sparse_attn_is_deterministic_and_honours_scale(device):
    _skip_unless(device)
    dtype = torch.float16
    gen = torch.Generator().manual_seed(7)
    q, k, v = randn_qkv(1, 2, 2, 192, 192, 64, dtype, device, "HND", gen)
    lut, counts = _random_lut(1, 2, 192, 192, 64, 64, 0.6, gen, device)
    a = sparge.block_sparse_attn(q, k, v, lut, counts, blkq=64, blkk=64, scale=0.3, return_lse=True)
    c = sparge.block_sparse_attn(q, k, v, lut, counts, blkq=64, blkk=64, scale=0.3, return_lse=True)
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])
    mask = utils.token_mask_from_lut(lut, counts, 192, 192, 64, 64)
    ref_o, _ = ref_attention(q, k, v, mask, scale=0.3)
    assert_close_to_ref(a[0], ref_o, sdpa_baseline(q, k, v, mask, scale=0.3), "scale=0.3")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("api", ["topk", "cdf"])
def test_sparge_attn_equals_attention_with_its_block_map(device, causal, layout, api):
    _skip_unless(device)
    dtype = torch.float16 if device == "cuda" else torch.float32
    b, hq, hk, s, d = 1, 4, 2, 384 if device == "cpu" else 1024, 128
    gen = torch.Generator().manual_seed(11 + causal + 2 * (layout == "NHD"))
    q, k, v = randn_qkv(b, hq, hk, s, s, d, dtype, device, layout, gen)
    # Random inputs have no self-similar blocks at upstream's cdf default (0.6), which would make the
    # map dense; -0.1 keeps every block rankable for both rules.
    sel = {"topk": 0.4} if api == "topk" else {"cdfthreshd": 0.5}
    sel["simthreshd1"] = -0.1
    o, lse, sparsity, lut, counts = sparge.sparge_attn(
        q, k, v, **sel, is_causal=causal, tensor_layout=layout, return_lse=True, return_sparsity=True,
        return_block_map=True)

    blk = sparge.DEFAULT_BLKQ, sparge.DEFAULT_BLKK
    nv = utils.visible_blocks_per_row(s, s, *blk, causal)
    nq, nk = len(nv), utils.num_blocks(s, blk[1])
    assert lut.shape == (b, hq, nq, nk) and counts.shape == (b, hq, nq)
    counts_c, lut_c = counts.cpu(), lut.cpu()
    nv_t = torch.tensor(nv).expand_as(counts_c)
    assert ((counts_c >= 1) & (counts_c <= nv_t)).all(), "every visible row selects 1..NV blocks"
    for bi, h, qb in itertools.product(range(b), range(hq), range(nq)):
        row = lut_c[bi, h, qb]
        c = int(counts_c[bi, h, qb])
        assert (row[c:] == -1).all() and (row[:c] >= 0).all() and (row[:c] < nv[qb]).all()
        assert (row[1:c] > row[:c - 1]).all(), "LUT rows ascend"
    expected_sparsity = 1.0 - counts_c.sum().item() / (sum(nv) * b * hq)
    assert abs(sparsity - expected_sparsity) < 1e-6
    assert sparsity > 0.0, "the test inputs should leave something out"

    mask = utils.token_mask_from_lut(lut, counts, s, s, *blk, causal)
    qh, kh, vh = (to_hnd(t, layout) for t in (q, k, v))
    ref_o, ref_lse = ref_attention(qh, kh, vh, mask)
    assert_close_to_ref(to_hnd(o, layout), ref_o, sdpa_baseline(qh, kh, vh, mask), "sparge_attn")
    assert_lse_close(lse, ref_lse, dtype, "sparge_attn")

    # The block map alone gives the same map (it is deterministic).
    lut2, counts2 = sparge.block_map(q, k, **sel, is_causal=causal, tensor_layout=layout)
    assert torch.equal(lut2, lut) and torch.equal(counts2, counts)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_topk_one_is_dense(device):
    _skip_unless(device)
    dtype = torch.float16
    gen = torch.Generator().manual_seed(3)
    q, k, v = randn_qkv(1, 2, 2, 256, 256, 64, dtype, device, "HND", gen)
    o, sp = sparge.sparge_attn(q, k, v, topk=1.0, is_causal=True, return_sparsity=True)
    assert sp == 0.0
    ref_o, _ = ref_attention(q, k, v, utils.causal_mask(256, 256))
    assert_close_to_ref(o, ref_o, sdpa_baseline(q, k, v, utils.causal_mask(256, 256, device)), "topk=1")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_upstream_aliases(device):
    _skip_unless(device)
    dtype = torch.float16
    gen = torch.Generator().manual_seed(5)
    q, k, v = randn_qkv(1, 2, 2, 256, 256, 64, dtype, device, "NHD", gen)
    o = sparge.spas_sage2_attn_meansim_topk_cuda(q, k, v, topk=0.5, tensor_layout="NHD")
    o2 = sparge.sparge_attn(q, k, v, topk=0.5, simthreshd1=-0.1, pvthreshd=50, tensor_layout="NHD")
    assert torch.equal(o, o2)
    o3, sp = sparge.spas_sage2_attn_meansim_cuda(q, k, v, tensor_layout="NHD", return_sparsity=True,
                                                 output_dtype=torch.float32)
    o4 = sparge.sparge_attn(q, k, v, cdfthreshd=0.98, simthreshd1=0.6, tensor_layout="NHD")
    assert o3.dtype == torch.float32 and torch.equal(o3, o4.float()) and 0.0 <= sp < 1.0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_dense_attn(device, causal, d):
    _skip_unless(device)
    for dtype in _dtypes(device):
        gen = torch.Generator().manual_seed(d + causal)
        q, k, v = randn_qkv(2, 4, 2, 150, 333, d, dtype, device, "NHD", gen)
        o, lse = sparge.dense_attn(q, k, v, is_causal=causal, tensor_layout="NHD", return_lse=True)
        mask = utils.causal_mask(150, 333) if causal else None
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        ref_o, ref_lse = ref_attention(qh, kh, vh, mask)
        assert_close_to_ref(o.transpose(1, 2), ref_o, sdpa_baseline(qh, kh, vh, mask), f"dense {dtype}")
        assert_lse_close(lse, ref_lse, dtype, f"dense {dtype}")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_merge_halves_of_the_keys(device):
    _skip_unless(device)
    for dtype in _dtypes(device):
        gen = torch.Generator().manual_seed(17)
        q, k, v = randn_qkv(1, 4, 2, 130, 260, 64, dtype, device, "HND", gen)
        oa, la = sparge.dense_attn(q, k[:, :, :100], v[:, :, :100], return_lse=True)
        ob, lb = sparge.dense_attn(q, k[:, :, 100:], v[:, :, 100:], return_lse=True)
        o, lse = sparge.merge_attn(oa, la, ob, lb)
        ref_o, ref_lse = ref_attention(q, k, v, None)
        assert_close_to_ref(o, ref_o, sdpa_baseline(q, k, v, None), f"merge {dtype}")
        assert_lse_close(lse, ref_lse, dtype, f"merge {dtype}")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_merge_disjoint_luts_with_empty_rows(device):
    """Two LUTs that split one LUT's blocks (causal, so some partials are empty rows) merge to the whole."""
    _skip_unless(device)
    dtype = torch.float16
    gen = torch.Generator().manual_seed(23)
    b, h, s, blk = 1, 2, 320, 64
    q, k, v = randn_qkv(b, h, h, s, s, 64, dtype, device, "NHD", gen)
    nq = utils.num_blocks(s, blk)
    bm = torch.rand(b, h, nq, nq, generator=gen) < 0.7
    take_a = torch.rand(b, h, nq, nq, generator=gen) < 0.5
    parts = [utils.lut_from_block_mask(m) for m in (bm & take_a, bm & ~take_a)]
    (oa, la), (ob, lb) = (sparge.block_sparse_attn(q, k, v, l.to(device), c.to(device), blkq=blk, blkk=blk, is_causal=True,
                                                   tensor_layout="NHD", return_lse=True) for l, c in parts)
    o, lse = sparge.merge_attn(oa, la, ob, lb, tensor_layout="NHD")
    lut, counts = utils.lut_from_block_mask(bm)
    mask = utils.token_mask_from_lut(lut, counts, s, s, blk, blk, True)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    ref_o, ref_lse = ref_attention(qh, kh, vh, mask)
    assert_close_to_ref(o.transpose(1, 2), ref_o, sdpa_baseline(qh, kh, vh, mask), "merge luts")
    assert_lse_close(lse, ref_lse, dtype, "merge luts")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_block_map_attention_sink_and_per_head_topk(device):
    _skip_unless(device)
    dtype = torch.float16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(31)
    s = 1024
    q, k, _ = randn_qkv(1, 4, 2, s, s, 64, dtype, device, "HND", gen)
    # Without the sink, block 0 is left out of some rows at this density; with it, every row has it.
    lut, counts = sparge.block_map(q, k, topk=0.1, simthreshd1=-0.1)
    assert (lut[..., 0] != 0).any()
    lut_s, counts_s = sparge.block_map(q, k, topk=0.1, simthreshd1=-0.1, attention_sink=True)
    assert (lut_s[..., 0] == 0).all()
    # Per-head topk (a list and a tensor give the same map): head h keeps floor(topk[h] * NV) blocks.
    per_head = [0.1, 0.25, 0.5, 1.0]
    _, c_list = sparge.block_map(q, k, topk=per_head, simthreshd1=-0.1)
    _, c_tensor = sparge.block_map(q, k, topk=torch.tensor(per_head), simthreshd1=-0.1)
    assert torch.equal(c_list, c_tensor)
    nk = utils.num_blocks(s, sparge.DEFAULT_BLKK)
    for h, t in enumerate(per_head):
        assert (c_list[0, h] == max(1, int(t * nk))).all(), f"head {h}"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fp8_recipe(device):
    """recipe="fp8" (docs/quantized.md): close to the unquantized result, finite, LSE close; on CUDA also
    close to the CPU specification; an unknown recipe is a ValueError naming it."""
    _skip_unless(device)
    gen = torch.Generator().manual_seed(7)
    b, hq, hk, sq, sk, d, blkq, blkk = 1, 4, 2, 384, 512, 128, 128, 64
    q, k, v = randn_qkv(b, hq, hk, sq, sk, d, torch.float16, device, "HND", gen)
    k = k + 2.0  # a K bias for the smoothing to remove
    lut, counts = _random_lut(b, hq, sq, sk, blkq, blkk, 0.5, gen, device)
    if device == "cuda" and torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(NotImplementedError, match="fp8"):  # `unsupported`: the fp8 kernel is sm_90 only
            sparge.block_sparse_attn(q, k, v, lut, counts, blkq=blkq, blkk=blkk, recipe="fp8")
        return
    o8, lse8 = sparge.block_sparse_attn(q, k, v, lut, counts, blkq=blkq, blkk=blkk, recipe="fp8", return_lse=True)
    o16, lse16 = sparge.block_sparse_attn(q, k, v, lut, counts, blkq=blkq, blkk=blkk, return_lse=True)
    assert torch.isfinite(o8).all()
    assert (o8.float() - o16.float()).abs().max().item() < 0.1
    finite = torch.isfinite(lse16)
    assert torch.equal(finite, torch.isfinite(lse8))
    assert (lse8[finite] - lse16[finite]).abs().max().item() < 0.05
    if device == "cuda":
        oc, lsec = sparge.block_sparse_attn(q.cpu(), k.cpu(), v.cpu(), lut.cpu(), counts.cpu(), blkq=blkq, blkk=blkk,
                                            recipe="fp8", return_lse=True)
        assert (o8.float().cpu() - oc.float()).abs().max().item() < 0.05
        assert (lse8.cpu()[finite.cpu()] - lsec[finite.cpu()]).abs().max().item() < 0.02
        o = sparge.sparge_attn(q, k, v, topk=0.5, blkq=blkq, blkk=blkk, recipe="fp8")
        assert torch.isfinite(o).all()
        # The fold (the block map writes the quantized Q / K): close to the CPU specification on its LUT,
        # and the same O with and without the LSE.
        of, lsef, lutf, countsf = sparge.sparge_attn(q, k, v, topk=0.5, blkq=blkq, blkk=blkk, recipe="fp8",
                                                     return_lse=True, return_block_map=True)
        assert torch.equal(of, o)
        oc, lsec = sparge.block_sparse_attn(q.cpu(), k.cpu(), v.cpu(), lutf.cpu(), countsf.cpu(), blkq=blkq,
                                            blkk=blkk, recipe="fp8", return_lse=True)
        assert (of.float().cpu() - oc.float()).abs().max().item() < 0.05
        fin = torch.isfinite(lsec)
        assert torch.equal(fin, torch.isfinite(lsef.cpu()))
        assert (lsef.cpu()[fin] - lsec[fin]).abs().max().item() < 0.02
    with pytest.raises(ValueError, match="recipe"):
        sparge.block_sparse_attn(q, k, v, lut, counts, blkq=blkq, blkk=blkk, recipe="int8")


# ------------------------------------------------------------------------------------------------
# Varlen (packed sequences): every sequence's rows equal the same call on that sequence alone.

_VARLEN_LENS = ([100, 1, 257, 64, 300], [130, 77, 257, 1, 300])  # q, k per sequence (Sq > Sk, Sk = 1, ...)


def _packed_qkv(lens_q, lens_k, hq, hk, d, dtype, device, gen):
    def mk(total, h):
        return torch.randn(total, h, d, generator=gen).to(device=device, dtype=dtype)
    cu = lambda lens: torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)
    return mk(sum(lens_q), hq), mk(sum(lens_k), hk), mk(sum(lens_k), hk), cu(lens_q), cu(lens_k)


def _tol(dtype):
    return dict(atol=0, rtol=0) if dtype == torch.float32 else dict(atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_dense_attn_varlen_matches_each_sequence(device, causal, d):
    _skip_unless(device)
    gen = torch.Generator().manual_seed(7 + d + causal)
    lens_q, lens_k = _VARLEN_LENS
    dtype = torch.float16 if device == "cuda" else torch.float32
    q, k, v, cq, ck = _packed_qkv(lens_q, lens_k, 4, 2, d, dtype, device, gen)
    o, lse = sparge.dense_attn_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), is_causal=causal, return_lse=True)
    assert o.shape == q.shape and lse.shape == (len(lens_q), 4, max(lens_q))
    for s in range(len(lens_q)):
        a, b, c, e = int(cq[s]), int(cq[s + 1]), int(ck[s]), int(ck[s + 1])
        o_s, lse_s = sparge.dense_attn(q[None, a:b], k[None, c:e], v[None, c:e], is_causal=causal,
                                       tensor_layout="NHD", return_lse=True)
        torch.testing.assert_close(o[a:b], o_s[0], **_tol(dtype), msg=f"sequence {s}")
        torch.testing.assert_close(lse[s, :, :b - a], lse_s[0], **_tol(torch.float32 if device == "cpu" else dtype))
        assert torch.isneginf(lse[s, :, b - a:]).all(), "lse past the sequence's end is -inf"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blk", [(128, 64), (64, 64), (128, 128)])
def test_sparge_attn_varlen_matches_each_sequence(device, causal, blk):
    """block_map_varlen gives each sequence the map block_map gives it alone; the attention over it too."""
    _skip_unless(device)
    gen = torch.Generator().manual_seed(11 + blk[1] + causal)
    lens_q, lens_k = _VARLEN_LENS
    if causal:
        lens_k = lens_q  # the block map's causal selection on self-attention shapes
    dtype = torch.float16 if device == "cuda" else torch.float32
    q, k, v, cq, ck = _packed_qkv(lens_q, lens_k, 4, 2, 128, dtype, device, gen)
    blkq, blkk = blk
    o, lse, lut, counts = sparge.sparge_attn_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), topk=0.5,
                                                    is_causal=causal, pvthreshd=None, return_lse=True,
                                                    blkq=blkq, blkk=blkk, return_block_map=True)
    for s in range(len(lens_q)):
        a, b, c, e = int(cq[s]), int(cq[s + 1]), int(ck[s]), int(ck[s + 1])
        o_s, lse_s, lut_s, counts_s = sparge.sparge_attn(q[None, a:b], k[None, c:e], v[None, c:e], topk=0.5,
                                                         is_causal=causal, pvthreshd=None, tensor_layout="NHD",
                                                         return_lse=True, blkq=blkq, blkk=blkk,
                                                         return_block_map=True)
        nq = counts_s.shape[2]
        assert torch.equal(counts[s, :, :nq], counts_s[0]), f"sequence {s}: counts"
        for h in range(4):
            for qb in range(nq):
                n = int(counts_s[0, h, qb])
                assert torch.equal(lut[s, h, qb, :n], lut_s[0, h, qb, :n]), f"sequence {s} head {h} block {qb}"
        assert (counts[s, :, nq:] == 0).all(), "query blocks past the sequence's end select nothing"
        torch.testing.assert_close(o[a:b], o_s[0], **_tol(dtype), msg=f"sequence {s}")
        torch.testing.assert_close(lse[s, :, :b - a], lse_s[0], **_tol(torch.float32 if device == "cpu" else dtype))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_varlen_hnd_layout_and_errors(device):
    _skip_unless(device)
    gen = torch.Generator().manual_seed(3)
    lens_q, lens_k = _VARLEN_LENS
    dtype = torch.float16 if device == "cuda" else torch.float32
    q, k, v, cq, ck = _packed_qkv(lens_q, lens_k, 4, 2, 64, dtype, device, gen)
    o = sparge.dense_attn_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k))
    o_hnd = sparge.dense_attn_varlen(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), cq, ck,
                                     max(lens_q), max(lens_k), tensor_layout="HND")
    assert torch.equal(o_hnd.transpose(0, 1), o)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        sparge.dense_attn_varlen(q, k, v, cq, ck, 0, max(lens_k))
    with pytest.raises(ValueError, match="expected 3"):
        sparge.dense_attn_varlen(q[None], k, v, cq, ck, max(lens_q), max(lens_k))
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        sparge.dense_attn_varlen(q, k, v, cq, ck[:-1], max(lens_q), max(lens_k))
    if device == "cpu":  # the CPU backend reads the bounds: a sequence longer than max_seqlen_q is an error
        with pytest.raises(ValueError, match="max_seqlen_q"):
            sparge.dense_attn_varlen(q, k, v, cq, ck, 100, max(lens_k))
