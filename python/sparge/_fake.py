"""Fake (meta) implementations of the torch.ops.sparge operators, for torch.compile and FakeTensor.

Each one allocates exactly what the C++ implementation in python/csrc/ops.cpp allocates: contiguous
outputs of the same shapes and dtypes, in the caller's layout. Keep the two files in step.
"""

import torch

_LAYOUTS = ("HND", "NHD")


def _check_layout(layout, op):
    if layout not in _LAYOUTS:
        raise ValueError(f"{op}: tensor_layout = {layout!r} (expected 'HND' = [B, H, S, D] or 'NHD' = [B, S, H, D])")


def _bshd(t, layout, op, name):
    """(B, S, H, D) of a 4-D attention tensor in `layout`."""
    _check_layout(layout, op)
    if t.dim() != 4:
        raise ValueError(f"{op}: {name} has {t.dim()} dimensions (expected 4)")
    b, x, y, d = t.shape
    return (b, y, x, d) if layout == "HND" else (b, x, y, d)


def _blocks(n, blk):
    return (n + blk - 1) // blk if blk > 0 else 1


def _lse(q, layout, want, op):
    b, s, h, _ = _bshd(q, layout, op, "q")
    if not want:
        return q.new_empty((0,), dtype=torch.float32)
    return q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.register_fake("sparge::block_map")
def _block_map(q, k, topk, cdfthreshd, simthreshd1, blkq, blkk, is_causal, attention_sink, smooth_k, scale,
               tensor_layout):
    b, sq, hq, _ = _bshd(q, tensor_layout, "sparge.block_map", "q")
    _, sk, _, _ = _bshd(k, tensor_layout, "sparge.block_map", "k")
    nq, nk = _blocks(sq, blkq), _blocks(sk, blkk)
    return (q.new_empty((b, hq, nq, nk), dtype=torch.int32), q.new_empty((b, hq, nq), dtype=torch.int32))


@torch.library.register_fake("sparge::block_sparse_attn")
def _block_sparse_attn(q, k, v, lut, counts, blkq, blkk, is_causal, scale, pv_threshold, tensor_layout,
                       return_lse, recipe="none"):
    return q.new_empty(q.shape), _lse(q, tensor_layout, return_lse, "sparge.block_sparse_attn")


@torch.library.register_fake("sparge::sparge_attn_fp8")
def _sparge_attn_fp8(q, k, v, topk, cdfthreshd, simthreshd1, blkq, blkk, is_causal, attention_sink, smooth_k, scale,
                     pv_threshold, tensor_layout, return_lse):
    lut, counts = _block_map(q, k, topk, cdfthreshd, simthreshd1, blkq, blkk, is_causal, attention_sink, smooth_k,
                             scale, tensor_layout)
    return q.new_empty(q.shape), _lse(q, tensor_layout, return_lse, "sparge.sparge_attn"), lut, counts


@torch.library.register_fake("sparge::dense_attn")
def _dense_attn(q, k, v, is_causal, scale, tensor_layout, return_lse):
    return q.new_empty(q.shape), _lse(q, tensor_layout, return_lse, "sparge.dense_attn")


@torch.library.register_fake("sparge::topk_select")
def _topk_select(scores, k):
    r = scores.shape[0]
    return scores.new_empty((r, k), dtype=torch.int32), scores.new_empty((r,), dtype=torch.int32)


@torch.library.register_fake("sparge::compact_mask")
def _compact_mask(mask, n_max):
    r = mask.shape[0]
    return mask.new_empty((r, n_max), dtype=torch.int32), mask.new_empty((r,), dtype=torch.int32)


@torch.library.register_fake("sparge::gather_attn")
def _gather_attn(q, k, v, indices, counts, is_causal, scale, group_union, union_rows, tensor_layout, return_lse,
                 check_lists):
    return q.new_empty(q.shape), _lse(q, tensor_layout, return_lse, "sparge.gather_attn")


@torch.library.register_fake("sparge::merge_attn")
def _merge_attn(o_a, lse_a, o_b, lse_b, tensor_layout):
    b, s, h, _ = _bshd(o_a, tensor_layout, "sparge.merge_attn", "o_a")
    return o_a.new_empty(o_a.shape), o_a.new_empty((b, h, s), dtype=torch.float32)


@torch.library.register_fake("sparge::dist_sparse_attn")
def _dist_sparse_attn(q, k, v, comm, rank, world, seq_len, topk, cdfthreshd, simthreshd1, blkq, blkk, is_causal,
                      attention_sink, smooth_k, scale, tensor_layout, return_lse, return_map, timeout):
    op = "sparge.dist_sparse_attn"
    b, l, hq, _ = _bshd(q, tensor_layout, op, "q")
    i32 = torch.int32
    if return_map:
        lut = q.new_empty((b, hq, _blocks(l, blkq), _blocks(seq_len, blkk)), dtype=i32)
        counts = q.new_empty((b, hq, _blocks(l, blkq)), dtype=i32)
    else:
        lut, counts = q.new_empty((0,), dtype=i32), q.new_empty((0,), dtype=i32)
    return q.new_empty(q.shape), _lse(q, tensor_layout, return_lse, op), lut, counts


# Varlen (packed [total, H, D] tensors; 'HND' = [H, total, D]): o like q, lse [num_seqs, Hq, max_seqlen_q],
# LUTs [num_seqs, Hq, NQ, NK] from the max lengths.
def _packed_heads(t, layout, op, name):
    _check_layout(layout, op)
    if t.dim() != 3:
        raise ValueError(f"{op}: {name} has {t.dim()} dimensions (expected 3)")
    return t.shape[0] if layout == "HND" else t.shape[1]


def _varlen_lse(q, cu_seqlens_q, max_seqlen_q, layout, want, op):
    hq = _packed_heads(q, layout, op, "q")
    if not want:
        return q.new_empty((0,), dtype=torch.float32)
    return q.new_empty((cu_seqlens_q.shape[0] - 1, hq, max_seqlen_q), dtype=torch.float32)


@torch.library.register_fake("sparge::dense_attn_varlen")
def _dense_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale,
                       tensor_layout, return_lse):
    return q.new_empty(q.shape), _varlen_lse(q, cu_seqlens_q, max_seqlen_q, tensor_layout, return_lse,
                                             "sparge.dense_attn_varlen")


@torch.library.register_fake("sparge::block_sparse_attn_varlen")
def _block_sparse_attn_varlen(q, k, v, lut, counts, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, blkq,
                              blkk, is_causal, scale, pv_threshold, tensor_layout, return_lse):
    return q.new_empty(q.shape), _varlen_lse(q, cu_seqlens_q, max_seqlen_q, tensor_layout, return_lse,
                                             "sparge.block_sparse_attn_varlen")


@torch.library.register_fake("sparge::block_map_varlen")
def _block_map_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, topk, cdfthreshd, simthreshd1,
                      blkq, blkk, is_causal, attention_sink, smooth_k, scale, tensor_layout):
    hq = _packed_heads(q, tensor_layout, "sparge.block_map_varlen", "q")
    n, nq, nk = cu_seqlens_q.shape[0] - 1, _blocks(max_seqlen_q, blkq), _blocks(max_seqlen_k, blkk)
    return q.new_empty((n, hq, nq, nk), dtype=torch.int32), q.new_empty((n, hq, nq), dtype=torch.int32)
