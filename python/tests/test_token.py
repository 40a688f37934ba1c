"""Token-level ops: topk_select against torch.topk and the documented order, compact_mask, gather_attn."""

import pytest
import torch

import sparge
from sparge import utils
from ref import (assert_close_to_ref, assert_lse_close, devices, randn_qkv, ref_attention, sdpa_baseline,
                 to_hnd)

DEVICES = devices()


def _skip_unless(device):
    if device not in DEVICES:
        pytest.skip(f"{device}: no CUDA device or sparge built without CUDA")


def _expected_topk_order(row, k):
    """The documented order: values strictly above the k-th largest ascending by index, then the
    indices equal to it ascending, as many as fit; -1 padding when fewer than k are selectable."""
    vals = row.tolist()
    selectable = sorted((i for i, x in enumerate(vals) if x != float("-inf")), key=lambda i: (-vals[i], i))
    if len(selectable) < k:
        chosen = sorted(selectable)
        return chosen + [-1] * (k - len(chosen)), len(chosen)
    kth = vals[selectable[k - 1]]
    above = [i for i, x in enumerate(vals) if x > kth]
    equal = [i for i, x in enumerate(vals) if x == kth][: k - len(above)]
    return above + equal, k


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,n,k", [(7, 1000, 37), (3, 2048, 512), (33, 129, 1), (5, 64, 64)])
def test_topk_select_matches_torch_topk(device, dtype, rows, n, k):
    _skip_unless(device)
    gen = torch.Generator().manual_seed(rows * n + k)
    # Distinct values (a permutation; exact in fp16 up to 2048), so the set is unique and torch.topk is
    # an exact oracle.
    scores = torch.stack([torch.randperm(n, generator=gen) for _ in range(rows)]).to(dtype).to(device)
    idx, cnt = sparge.topk_select(scores, k)
    assert idx.shape == (rows, k) and idx.dtype == torch.int32 and cnt.tolist() == [k] * rows
    ref = torch.topk(scores.float(), k, dim=-1).indices
    for r in range(rows):
        assert set(idx[r].tolist()) == set(ref[r].tolist()), f"row {r}: selected set differs"
        assert idx[r].tolist() == _expected_topk_order(scores[r].float().cpu(), k)[0], f"row {r}: order"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_topk_select_ties_and_neg_inf(device):
    _skip_unless(device)
    inf = float("inf")
    scores = torch.tensor([
        [1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0, 2.0],      # ties at the k-th value: lowest indices first
        [-inf, -inf, 5.0, -inf, -inf, 1.0, -inf, -inf],  # fewer than k selectable: -1 padding
        [-inf] * 8,                                      # nothing selectable
        [inf, 0.0, -1.0, inf, 7.0, 7.0, 7.0, 7.0],     # +inf is the largest
    ], device=device)
    k = 4
    idx, cnt = sparge.topk_select(scores, k)
    for r in range(scores.shape[0]):
        want, want_cnt = _expected_topk_order(scores[r].cpu(), k)
        assert idx[r].tolist() == want, f"row {r}"
        assert int(cnt[r]) == want_cnt, f"row {r}"
    # Leading dimensions are flattened and restored.
    idx3, cnt3 = sparge.topk_select(scores.reshape(2, 2, 8), k)
    assert torch.equal(idx3.reshape(4, k), idx) and torch.equal(cnt3.reshape(4), cnt)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_topk_select_rejects_nan(device):
    _skip_unless(device)
    scores = torch.zeros(3, 16, device=device)
    scores[1, 5] = float("nan")
    with pytest.raises((ValueError, RuntimeError)):
        sparge.topk_select(scores, 4)
        if device == "cuda":
            torch.cuda.synchronize()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compact_mask(device, dtype):
    _skip_unless(device)
    gen = torch.Generator().manual_seed(1)
    r, n, n_max = 9, 300, 200
    keep = torch.rand(r, n, generator=gen) < torch.linspace(0.0, 0.6, r).unsqueeze(1)
    mask = torch.where(keep, torch.randn(r, n, generator=gen), torch.full((r, n), float("-inf"))).to(dtype)
    idx, cnt = sparge.compact_mask(mask.to(device), n_max)
    assert idx.shape == (r, n_max) and idx.dtype == torch.int32
    for row in range(r):
        want = keep[row].nonzero().flatten().tolist()
        assert int(cnt[row]) == len(want)
        assert idx[row].tolist() == want + [-1] * (n_max - len(want))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compact_mask_overflow_is_an_error(device):
    _skip_unless(device)
    mask = torch.zeros(4, 64, device=device)
    mask[2, 10:] = float("-inf")  # row 2 has 10 finite entries, the others 64
    idx, cnt = sparge.compact_mask(mask, 64)
    assert cnt.tolist() == [64, 64, 10, 64]
    with pytest.raises(ValueError):
        sparge.compact_mask(mask, 32)
        if device == "cuda":
            torch.cuda.synchronize()


def _random_lists(b, h, sq, sk, n_max, gen, device):
    """Distinct random keys per row (the first counts entries), -1 padded; some rows empty."""
    scores = torch.rand(b, h, sq, sk, generator=gen)
    idx = torch.topk(scores, n_max, dim=-1).indices.to(torch.int32)
    counts = torch.randint(0, n_max + 1, (b, h, sq), generator=gen, dtype=torch.int32)
    counts[:, :, 0] = 0
    counts[:, :, 1] = n_max
    pad = torch.arange(n_max) >= counts.unsqueeze(-1)
    idx = torch.where(pad, torch.full_like(idx, -1), idx)
    return idx.to(device), counts.to(device)


def _gather_mask(idx, counts, sk):
    b, h, sq, n_max = idx.shape
    valid = torch.arange(n_max, device=idx.device) < counts.unsqueeze(-1)
    hits = torch.zeros(b, h, sq, sk, dtype=torch.int32, device=idx.device)
    hits.scatter_add_(-1, idx.long().clamp(min=0), valid.to(torch.int32))
    return hits > 0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group_union", [False, True])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_gather_attn(device, causal, group_union, layout):
    _skip_unless(device)
    dtypes = [torch.float16, torch.bfloat16] + ([torch.float32] if device == "cpu" else [])
    for dtype in dtypes:
        for d in (64, 128):
            gen = torch.Generator().manual_seed(d + 2 * causal + 4 * group_union)
            b, hq, hk, sq, sk, n_max = 1, 4, 2, 130, 300, 48
            q, k, v = randn_qkv(b, hq, hk, sq, sk, d, dtype, device, layout, gen)
            idx, counts = _random_lists(b, hq, sq, sk, n_max, gen, device)
            o, lse = sparge.gather_attn(q, k, v, idx, counts, is_causal=causal, group_union=group_union,
                                        return_lse=True, tensor_layout=layout)
            mask = _gather_mask(idx.cpu(), counts.cpu(), sk)
            if causal:
                mask = mask & utils.causal_mask(sq, sk)
            qh, kh, vh = (to_hnd(t, layout) for t in (q, k, v))
            ref_o, ref_lse = ref_attention(qh, kh, vh, mask)
            name = f"gather {dtype} d{d}"
            assert_close_to_ref(to_hnd(o, layout), ref_o, sdpa_baseline(qh, kh, vh, mask), name)
            assert_lse_close(lse, ref_lse, dtype, name)
            assert (to_hnd(o, layout)[:, :, 0] == 0).all(), "an empty list gives O = 0"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group_union", [False, True])
@pytest.mark.parametrize("hq,hk", [(4, 4), (4, 2), (8, 2)])
def test_gather_attn_kv_head_lists(device, causal, group_union, hq, hk):
    """indices [B, Hk, Sq, n_max]: query head h reads list h // (Hq // Hk); the same result as the
    per-query-head layout with each list repeated for the group's heads (bitwise on one backend)."""
    _skip_unless(device)
    dtype = torch.float16
    gen = torch.Generator().manual_seed(7 + hq + 2 * hk + 16 * causal + 32 * group_union)
    b, sq, sk, n_max, d = 2, 70, 200, 40, 64
    q, k, v = randn_qkv(b, hq, hk, sq, sk, d, dtype, device, "HND", gen)
    idx, counts = _random_lists(b, hk, sq, sk, n_max, gen, device)
    o, lse = sparge.gather_attn(q, k, v, idx, counts, is_causal=causal, group_union=group_union, return_lse=True)
    g = hq // hk
    idx_q, counts_q = idx.repeat_interleave(g, dim=1), counts.repeat_interleave(g, dim=1)
    o_q, lse_q = sparge.gather_attn(q, k, v, idx_q, counts_q, is_causal=causal, group_union=group_union,
                                    return_lse=True)
    assert torch.equal(o, o_q) and torch.equal(lse, lse_q), "kv-head lists == the per-query-head expansion"
    mask = _gather_mask(idx_q.cpu(), counts_q.cpu(), sk)
    if causal:
        mask = mask & utils.causal_mask(sq, sk)
    ref_o, ref_lse = ref_attention(q, k, v, mask)
    assert_close_to_ref(o, ref_o, sdpa_baseline(q, k, v, mask), f"gather kv-lists hq{hq} hk{hk}")
    assert_lse_close(lse, ref_lse, dtype, f"gather kv-lists hq{hq} hk{hk}")
    if hq != hk:
        with pytest.raises(ValueError, match=r"indices.shape\[1\] = 3"):
            sparge.gather_attn(q, k, v, idx[:, :1].repeat(1, 3, 1, 1).contiguous(),
                               counts[:, :1].repeat(1, 3, 1).contiguous())


def test_gather_attn_unchecked_cuda_graph():
    """check_lists=False: bitwise the checked call; captured in a torch CUDA graph and replayed with new
    inputs copied in; the checked call is refused on a capturing stream."""
    _skip_unless("cuda")
    gen = torch.Generator().manual_seed(11)
    b, hq, hk, sq, sk, n_max, d = 1, 8, 2, 130, 1000, 96, 128
    q, k, v = randn_qkv(b, hq, hk, sq, sk, d, torch.float16, "cuda", "HND", gen)
    idx, counts = _random_lists(b, hk, sq, sk, n_max, gen, "cuda")
    ref = sparge.gather_attn(q, k, v, idx, counts, group_union=True)
    assert torch.equal(sparge.gather_attn(q, k, v, idx, counts, group_union=True, check_lists=False), ref)
    q_in = q.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture (allocator, kernel attributes)
        sparge.gather_attn(q_in, k, v, idx, counts, group_union=True, check_lists=False)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with pytest.raises(ValueError, match="check_lists = true on a stream that is being captured"):
            sparge.gather_attn(q_in, k, v, idx, counts, group_union=True)
        out = sparge.gather_attn(q_in, k, v, idx, counts, group_union=True, check_lists=False)
    for scale in (1.0, 0.5):
        q_in.copy_(q * scale)
        graph.replay()
        torch.cuda.synchronize()
        want = ref if scale == 1.0 else sparge.gather_attn(q * scale, k, v, idx, counts, group_union=True)
        assert torch.equal(out, want), f"graph replay (q * {scale}) differs from the direct call"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_topk_then_gather_pipeline(device):
    """The token-level pipeline: scores -> topk_select -> gather_attn equals attention over the top-k keys."""
    _skip_unless(device)
    dtype = torch.float16
    gen = torch.Generator().manual_seed(99)
    b, h, s, d, kk = 1, 2, 256, 64, 32
    q, k, v = randn_qkv(b, h, h, s, s, d, dtype, device, "HND", gen)
    scores = (q.float() @ k.float().transpose(-1, -2))  # [B, H, S, S]
    idx, cnt = sparge.topk_select(scores, kk)
    assert idx.shape == (b, h, s, kk) and cnt.shape == (b, h, s)
    o = sparge.gather_attn(q, k, v, idx, cnt)
    mask = _gather_mask(idx.cpu(), cnt.cpu(), s)
    ref_o, _ = ref_attention(q, k, v, mask)
    assert_close_to_ref(o, ref_o, sdpa_baseline(q, k, v, mask), "topk+gather")
