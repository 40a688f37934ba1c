"""The Python API of sparge. Every function here is a thin wrapper over a torch custom op
(torch.ops.sparge.*, registered by sparge._C, fake implementations in _fake.py), so it runs eagerly
on CPU tensors (the CPU backend) and CUDA tensors (the CUDA backend, current stream), and traces
under torch.compile(fullgraph=True).

Layouts: tensor_layout="HND" means [B, H, S, D], "NHD" means [B, S, H, D]; any strides work (views
are passed to the library without copies). Outputs are contiguous, in the inputs' layout.
GQA: Hq may be a multiple of Hk; query head h reads kv head h // (Hq // Hk).
"""

import math
import numbers

import torch

from . import utils

# Block sizes of the block map when the caller does not choose (the library accepts 64 or 128 each):
# 128 x 64 as upstream SpargeAttn. On the H200 (2026-11-30) it is the fastest LUT for both kernels:
# the sm90 path pairs 64-key blocks into 128-key tiles at BLKQ 128, the portable path keeps 128-row
# warps busy, and the block map has half the pooled-Q rows of 64 x 64.
DEFAULT_BLKQ = 128
DEFAULT_BLKK = 64

# Defaults of upstream SpargeAttn's two public APIs (spas_sage_attn/core.py).
TOPK_API_DEFAULTS = {"topk": 0.5, "simthreshd1": -0.1, "pvthreshd": 50.0}
CDF_API_DEFAULTS = {"cdfthreshd": 0.98, "simthreshd1": 0.6, "pvthreshd": 50.0}

_ops = torch.ops.sparge


# ------------------------------------------------------------------------------------------------
# Argument normalisation (messages name the function, the parameter and the value).

def _scale(scale, op):
    """None -> 0.0, which the library reads as 1/sqrt(D)."""
    if scale is None:
        return 0.0
    s = float(scale)
    if not math.isfinite(s) or s <= 0.0:
        raise ValueError(f"{op}: scale = {scale} (expected a finite value > 0, or None for 1/sqrt(D))")
    return s


def _per_head(x, op, name):
    """A per-head parameter as a list of floats (or None): a number, a list/tuple, or a 0-D/1-D tensor."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        if x.dim() > 1:
            raise ValueError(f"{op}: {name} is a tensor of shape {tuple(x.shape)} (expected a number or 1-D, "
                             "one value per query head)")
        return [float(v) for v in x.detach().reshape(-1).tolist()]
    if isinstance(x, numbers.Real):
        return [float(x)]
    if isinstance(x, (list, tuple)):
        return [float(v) for v in x]
    raise ValueError(f"{op}: {name} = {x!r} (expected a number, a list of numbers or a 1-D tensor)")


def _layout(tensor_layout, op):
    if tensor_layout not in ("HND", "NHD"):
        raise ValueError(f"{op}: tensor_layout = {tensor_layout!r} (expected 'HND' = [B, H, S, D] "
                         "or 'NHD' = [B, S, H, D])")
    return tensor_layout


def _check_qk(q, k, ndim, shape, op):
    """q and k are tensors of ndim dimensions (shape: how the message names them)."""
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name} is a {type(t).__name__} (expected a torch.Tensor)")
        if t.dim() != ndim:
            raise ValueError(f"{op}: {name} has {t.dim()} dimensions (expected {ndim}: {shape})")


def _dims(q, k, tensor_layout, op):
    """(B, Sq, Sk, Hq) from 4-D q and k in the given layout."""
    _check_qk(q, k, 4, "[B, H, S, D]" if tensor_layout == "HND" else "[B, S, H, D]", op)
    s_dim, h_dim = (2, 1) if tensor_layout == "HND" else (1, 2)
    return q.shape[0], q.shape[s_dim], k.shape[s_dim], q.shape[h_dim]


def _int32(t, op, name):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: {name} is a {type(t).__name__} (expected a torch.Tensor)")
    if t.dtype == torch.int64:
        return t.to(torch.int32)
    return t


def _selection(topk, cdfthreshd, simthreshd1, op):
    """sparge_attn's block selection: one of topk / cdfthreshd (neither: the topk API's defaults), and
    simthreshd1=None as upstream's API for the chosen one. Returns (topk, cdfthreshd, simthreshd1)."""
    if topk is not None and cdfthreshd is not None:
        raise ValueError(f"{op}: give one of topk = {topk!r} and cdfthreshd = {cdfthreshd!r}, not both")
    if topk is None and cdfthreshd is None:
        topk = TOPK_API_DEFAULTS["topk"]
    if simthreshd1 is None:
        simthreshd1 = TOPK_API_DEFAULTS["simthreshd1"] if topk is not None else CDF_API_DEFAULTS["simthreshd1"]
    return topk, cdfthreshd, simthreshd1


def _check_block(blk, op, name):
    if not isinstance(blk, numbers.Integral) or isinstance(blk, bool):
        raise ValueError(f"{op}: {name} = {blk!r} (expected 64 or 128)")
    return int(blk)


# ------------------------------------------------------------------------------------------------
# Stage 1 and 2.

def block_map(q, k, topk=None, cdfthreshd=None, simthreshd1=None, blkq=DEFAULT_BLKQ, blkk=DEFAULT_BLKK,
              is_causal=False, attention_sink=False, smooth_k=True, tensor_layout="HND", scale=None):
    """The SpargeAttn block map: (lut [B, Hq, NQ, NK] int32, counts [B, Hq, NQ] int32).

    Exactly one of topk / cdfthreshd (each in (0, 1], a number or one value per query head).
    simthreshd1=None disables the self-similarity test (every block counts as self-similar).
    """
    op = "sparge.block_map"
    _layout(tensor_layout, op)
    _dims(q, k, tensor_layout, op)
    return _ops.block_map(q, k, _per_head(topk, op, "topk"), _per_head(cdfthreshd, op, "cdfthreshd"),
                          _per_head(simthreshd1, op, "simthreshd1"), _check_block(blkq, op, "blkq"),
                          _check_block(blkk, op, "blkk"), bool(is_causal), bool(attention_sink), bool(smooth_k),
                          _scale(scale, op), tensor_layout)


def block_sparse_attn(q, k, v, lut, counts, blkq=DEFAULT_BLKQ, blkk=DEFAULT_BLKK, is_causal=False, scale=None,
                      pvthreshd=None, tensor_layout="HND", return_lse=False, recipe="none"):
    """Attention over the key blocks of each query block's LUT row: o (and lse [B, Hq, Sq] fp32).

    lut/counts as returned by block_map (int64 is accepted and converted). pvthreshd (log2 units,
    upstream's default is 50) skips PV products of blocks whose probabilities are negligible;
    None never skips. recipe="fp8" quantizes Q, K (smoothed) and V to fp8 e4m3 and runs both GEMMs
    in fp8 (docs/quantized.md; CUDA: sm_90, head dim 128, blkq 128).
    """
    op = "sparge.block_sparse_attn"
    _layout(tensor_layout, op)
    o, lse = _ops.block_sparse_attn(q, k, v, _int32(lut, op, "lut"), _int32(counts, op, "counts"),
                                    _check_block(blkq, op, "blkq"), _check_block(blkk, op, "blkk"),
                                    bool(is_causal), _scale(scale, op), _per_head(pvthreshd, op, "pvthreshd"),
                                    tensor_layout, bool(return_lse), str(recipe))
    return (o, lse) if return_lse else o


def dense_attn(q, k, v, is_causal=False, scale=None, tensor_layout="HND", return_lse=False):
    """Dense attention (the same kernel as a full LUT on CUDA; the fp64 oracle on CPU)."""
    op = "sparge.dense_attn"
    _layout(tensor_layout, op)
    o, lse = _ops.dense_attn(q, k, v, bool(is_causal), _scale(scale, op), tensor_layout, bool(return_lse))
    return (o, lse) if return_lse else o


def assemble(o, lse=None, block_map=None, sparsity=None):
    """The return value of the sparge_attn family: o, then lse, the sparsity and (lut, counts), each when
    given (not None); a lone o is returned bare."""
    out = [o]
    if lse is not None:
        out.append(lse)
    if sparsity is not None:
        out.append(sparsity)
    if block_map is not None:
        out += list(block_map)
    return out[0] if len(out) == 1 else tuple(out)


def sparsity_of(counts, sq, sk, blkq, blkk, is_causal):
    """1 - density, density = sum(counts) / sum(visible blocks); a 0-D fp32 tensor (no host sync)."""
    nv = utils.visible_blocks(sq, sk, blkq, blkk, is_causal) * counts.shape[0] * counts.shape[1]
    if nv == 0:
        return torch.zeros((), dtype=torch.float32, device=counts.device)
    return 1.0 - counts.sum(dtype=torch.float64).to(torch.float32) / nv


def sparge_attn(q, k, v, topk=None, cdfthreshd=None, simthreshd1=None, pvthreshd=50.0, is_causal=False,
                attention_sink=False, smooth_k=True, tensor_layout="HND", scale=None, return_lse=False,
                return_sparsity=False, *, blkq=DEFAULT_BLKQ, blkk=DEFAULT_BLKK, return_block_map=False,
                recipe="none"):
    """SpargeAttn: predict the block map from Q and K, then run block-sparse attention on it.

    Selection: topk (fraction of the visible key blocks kept per query block) or cdfthreshd (the
    smallest prefix of the ranked blocks whose probability mass reaches it), a number or one value
    per query head. With neither, the topk API's defaults apply (topk=0.5, simthreshd1=-0.1);
    simthreshd1=None picks -0.1 for topk and 0.6 for cdfthreshd, as upstream's two APIs do.

    Returns o, then lse [B, Hq, Sq] fp32 if return_lse, then the sparsity (1 - computed fraction of
    the causally visible blocks; a float, a 0-D tensor under torch.compile) if return_sparsity, then
    (lut, counts) if return_block_map. recipe="fp8": the fp8 recipe of block_sparse_attn.
    """
    op = "sparge.sparge_attn"
    _layout(tensor_layout, op)
    topk, cdfthreshd, simthreshd1 = _selection(topk, cdfthreshd, simthreshd1, op)
    b, sq, sk, _ = _dims(q, k, tensor_layout, op)
    blkq, blkk = _check_block(blkq, op, "blkq"), _check_block(blkk, op, "blkk")
    s = _scale(scale, op)
    if recipe == "fp8" and q.is_cuda:
        # The fold (docs/quantized.md): the block map writes the recipe's quantized Q and K while it
        # reads them, and the attention quantizes only V.
        o, lse, lut, counts = _ops.sparge_attn_fp8(
            q, k, v, _per_head(topk, op, "topk"), _per_head(cdfthreshd, op, "cdfthreshd"),
            _per_head(simthreshd1, op, "simthreshd1"), blkq, blkk, bool(is_causal), bool(attention_sink),
            bool(smooth_k), s, _per_head(pvthreshd, op, "pvthreshd"), tensor_layout, bool(return_lse))
    else:
        lut, counts = _ops.block_map(q, k, _per_head(topk, op, "topk"), _per_head(cdfthreshd, op, "cdfthreshd"),
                                     _per_head(simthreshd1, op, "simthreshd1"), blkq, blkk, bool(is_causal),
                                     bool(attention_sink), bool(smooth_k), s, tensor_layout)
        o, lse = _ops.block_sparse_attn(q, k, v, lut, counts, blkq, blkk, bool(is_causal), s,
                                        _per_head(pvthreshd, op, "pvthreshd"), tensor_layout, bool(return_lse),
                                        str(recipe))
    sp = None
    if return_sparsity:
        sp = sparsity_of(counts, sq, sk, blkq, blkk, bool(is_causal))
        sp = sp if torch.compiler.is_compiling() else float(sp.item())
    return assemble(o, lse if return_lse else None, (lut, counts) if return_block_map else None, sparsity=sp)


# ------------------------------------------------------------------------------------------------
# Varlen: packed sequences, as FlashAttention's varlen functions take them.

def _varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, tensor_layout, op):
    """Checks the packed tensors and the sequence bounds; returns (cu_q, cu_k, max_q, max_k) as the ops take them."""
    _layout(tensor_layout, op)
    _check_qk(q, k, 3, ("[H, total, D]" if tensor_layout == "HND" else "[total, H, D]") + ", the sequences packed", op)
    cus = []
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name} is a {type(t).__name__} (expected a 1-D int32 tensor [num_seqs + 1])")
        cus.append(_int32(t, op, name).contiguous())
    maxes = []
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, numbers.Integral) or isinstance(m, bool) or m < 1:
            raise ValueError(f"{op}: {name} = {m!r} (expected an int >= 1, the longest sequence)")
        maxes.append(int(m))
    return cus[0], cus[1], maxes[0], maxes[1]


def dense_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None,
                      tensor_layout="NHD", return_lse=False):
    """Dense attention over packed sequences: q [total_q, Hq, D], k / v [total_k, Hk, D] ('NHD'; 'HND' =
    [H, total, D]); sequence s owns rows cu_seqlens[s] .. cu_seqlens[s + 1] - 1 (int32 [num_seqs + 1] on
    q's device), each at most max_seqlen long. Causal masking is bottom-right aligned per sequence.
    Returns o like q (and lse [num_seqs, Hq, max_seqlen_q] fp32, -inf past each sequence's end).
    """
    op = "sparge.dense_attn_varlen"
    cq, ck, mq, mk = _varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, tensor_layout, op)
    o, lse = _ops.dense_attn_varlen(q, k, v, cq, ck, mq, mk, bool(is_causal), _scale(scale, op), tensor_layout,
                                    bool(return_lse))
    return (o, lse) if return_lse else o


def block_map_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, topk=None, cdfthreshd=None,
                     simthreshd1=None, blkq=DEFAULT_BLKQ, blkk=DEFAULT_BLKK, is_causal=False, attention_sink=False,
                     smooth_k=True, tensor_layout="NHD", scale=None):
    """block_map over packed sequences (dense_attn_varlen's layout): (lut [num_seqs, Hq, NQ, NK], counts
    [num_seqs, Hq, NQ]) with NQ / NK from max_seqlen_q / _k; each sequence's map is the one block_map
    gives it alone."""
    op = "sparge.block_map_varlen"
    cq, ck, mq, mk = _varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, tensor_layout, op)
    return _ops.block_map_varlen(q, k, cq, ck, mq, mk, _per_head(topk, op, "topk"),
                                 _per_head(cdfthreshd, op, "cdfthreshd"), _per_head(simthreshd1, op, "simthreshd1"),
                                 _check_block(blkq, op, "blkq"), _check_block(blkk, op, "blkk"), bool(is_causal),
                                 bool(attention_sink), bool(smooth_k), _scale(scale, op), tensor_layout)


def block_sparse_attn_varlen(q, k, v, lut, counts, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             blkq=DEFAULT_BLKQ, blkk=DEFAULT_BLKK, is_causal=False, scale=None, pvthreshd=None,
                             tensor_layout="NHD", return_lse=False):
    """block_sparse_attn over packed sequences (dense_attn_varlen's layout), with the LUT of
    block_map_varlen ([num_seqs, Hq, NQ, NK])."""
    op = "sparge.block_sparse_attn_varlen"
    cq, ck, mq, mk = _varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, tensor_layout, op)
    o, lse = _ops.block_sparse_attn_varlen(q, k, v, _int32(lut, op, "lut"), _int32(counts, op, "counts"), cq, ck, mq,
                                           mk, _check_block(blkq, op, "blkq"), _check_block(blkk, op, "blkk"),
                                           bool(is_causal), _scale(scale, op), _per_head(pvthreshd, op, "pvthreshd"),
                                           tensor_layout, bool(return_lse))
    return (o, lse) if return_lse else o


def sparge_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, topk=None, cdfthreshd=None,
                       simthreshd1=None, pvthreshd=50.0, is_causal=False, attention_sink=False, smooth_k=True,
                       tensor_layout="NHD", scale=None, return_lse=False, *, blkq=DEFAULT_BLKQ, blkk=DEFAULT_BLKK,
                       return_block_map=False):
    """sparge_attn over packed sequences: block_map_varlen, then block_sparse_attn_varlen (the same
    selection defaults as sparge_attn). Returns o, then lse if return_lse, then (lut, counts) if
    return_block_map."""
    op = "sparge.sparge_attn_varlen"
    topk, cdfthreshd, simthreshd1 = _selection(topk, cdfthreshd, simthreshd1, op)
    cq, ck, mq, mk = _varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, tensor_layout, op)
    blkq, blkk = _check_block(blkq, op, "blkq"), _check_block(blkk, op, "blkk")
    s = _scale(scale, op)
    lut, counts = _ops.block_map_varlen(q, k, cq, ck, mq, mk, _per_head(topk, op, "topk"),
                                        _per_head(cdfthreshd, op, "cdfthreshd"),
                                        _per_head(simthreshd1, op, "simthreshd1"), blkq, blkk, bool(is_causal),
                                        bool(attention_sink), bool(smooth_k), s, tensor_layout)
    o, lse = _ops.block_sparse_attn_varlen(q, k, v, lut, counts, cq, ck, mq, mk, blkq, blkk, bool(is_causal), s,
                                           _per_head(pvthreshd, op, "pvthreshd"), tensor_layout, bool(return_lse))
    return assemble(o, lse if return_lse else None, (lut, counts) if return_block_map else None)


# ------------------------------------------------------------------------------------------------
# Upstream-compatible names (spas_sage_attn.core). Same positional order and defaults; differences:
# attn_mask and dropout_p must be None / 0 (upstream ignores them silently), output_dtype=None keeps
# the input dtype, and with both return_lse and return_sparsity the result is (o, lse, sparsity).

def _upstream_common(op, attn_mask, dropout_p):
    if attn_mask is not None:
        raise ValueError(f"{op}: attn_mask is not supported (upstream ignores it); pass your own block mask "
                         "to sparge.block_sparse_attn via sparge.utils.lut_from_block_mask")
    if dropout_p != 0.0:
        raise ValueError(f"{op}: dropout_p = {dropout_p} is not supported (expected 0.0)")


def _cast_output(result, output_dtype):
    if output_dtype is None:
        return result
    if isinstance(result, tuple):
        return (result[0].to(output_dtype),) + result[1:]
    return result.to(output_dtype)


def spas_sage2_attn_meansim_topk_cuda(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                      smooth_k=True, simthreshd1=-0.1, cdfthreshd=None, topk=0.5, pvthreshd=50,
                                      attention_sink=False, tensor_layout="HND", output_dtype=None,
                                      return_sparsity=False, return_lse=False):
    """Upstream's top-k API (recommended plug-and-play replacement of SDPA)."""
    _upstream_common("spas_sage2_attn_meansim_topk_cuda", attn_mask, dropout_p)
    r = sparge_attn(q, k, v, topk=topk, cdfthreshd=cdfthreshd, simthreshd1=simthreshd1, pvthreshd=pvthreshd,
                    is_causal=is_causal, attention_sink=attention_sink, smooth_k=smooth_k,
                    tensor_layout=tensor_layout, scale=scale, return_lse=return_lse,
                    return_sparsity=return_sparsity)
    return _cast_output(r, output_dtype)


def spas_sage2_attn_meansim_cuda(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 smooth_k=True, simthreshd1=0.6, cdfthreshd=0.98, pvthreshd=50,
                                 attention_sink=False, tensor_layout="HND", output_dtype=None,
                                 return_sparsity=False, return_lse=False):
    """Upstream's CDF API."""
    _upstream_common("spas_sage2_attn_meansim_cuda", attn_mask, dropout_p)
    r = sparge_attn(q, k, v, cdfthreshd=cdfthreshd, simthreshd1=simthreshd1, pvthreshd=pvthreshd,
                    is_causal=is_causal, attention_sink=attention_sink, smooth_k=smooth_k,
                    tensor_layout=tensor_layout, scale=scale, return_lse=return_lse,
                    return_sparsity=return_sparsity)
    return _cast_output(r, output_dtype)


# ------------------------------------------------------------------------------------------------
# Stage 3 and merging.

def topk_select(scores, k):
    """The k largest of each row of scores [..., N] (float32 or float16): (indices, counts).

    indices [..., k] int32: the indices whose value is strictly above the k-th largest, ascending,
    then the indices equal to it, ascending, as many as fit; -1 pads rows with fewer than k
    selectable values (-inf is never selected; NaN is an error). counts [...] int32: valid entries.
    """
    op = "sparge.topk_select"
    if not isinstance(scores, torch.Tensor) or scores.dim() < 1:
        raise ValueError(f"{op}: scores must be a tensor of at least 1 dimension ([..., N])")
    lead = scores.shape[:-1]
    idx, cnt = _ops.topk_select(scores.reshape(-1, scores.shape[-1]), int(k))
    return idx.reshape(*lead, idx.shape[-1]), cnt.reshape(lead)


def compact_mask(mask, n_max):
    """Indices of the finite entries of an additive mask [..., N] (0/finite keep, -inf drop).

    Returns (indices [..., n_max] int32 ascending, -1 padded; counts [...] int32). A row with more
    than n_max finite entries raises ValueError (never a silent truncation); NaN and +inf too.
    """
    op = "sparge.compact_mask"
    if not isinstance(mask, torch.Tensor) or mask.dim() < 1:
        raise ValueError(f"{op}: mask must be a tensor of at least 1 dimension ([..., N])")
    lead = mask.shape[:-1]
    idx, cnt = _ops.compact_mask(mask.reshape(-1, mask.shape[-1]), int(n_max))
    return idx.reshape(*lead, idx.shape[-1]), cnt.reshape(lead)


def gather_attn(q, k, v, indices, counts, is_causal=False, scale=None, group_union=False, return_lse=False,
                tensor_layout="HND", union_rows=64, check_lists=True):
    """Each query row attends its own list of keys: indices [B, Hq, Sq, n_max] (-1 padded after
    counts [B, Hq, Sq]), or one list per kv head, indices [B, Hk, Sq, n_max] / counts [B, Hk, Sq]
    (query head h reads list h // (Hq // Hk)). With is_causal, listed keys after the row's causal
    bound are skipped.
    group_union only changes how the GPU kernel loads keys (same result up to summation order).
    check_lists=False (CUDA) trusts the lists: no device-to-host read-back, so the call never waits
    for the GPU and can be captured in a CUDA graph; a count outside [0, n_max] is clamped, an index
    outside [0, Sk) skipped, a repeated key counted once, and no error is raised. The default checks
    them and raises on a bad entry (a call on a capturing stream is refused).
    """
    op = "sparge.gather_attn"
    _layout(tensor_layout, op)
    o, lse = _ops.gather_attn(q, k, v, _int32(indices, op, "indices"), _int32(counts, op, "counts"),
                              bool(is_causal), _scale(scale, op), bool(group_union), int(union_rows),
                              tensor_layout, bool(return_lse), bool(check_lists))
    return (o, lse) if return_lse else o


def merge_attn(o_a, lse_a, o_b, lse_b, tensor_layout="HND"):
    """Merge two partial attentions over disjoint key sets by their LSE: (o, lse)."""
    _layout(tensor_layout, "sparge.merge_attn")
    return _ops.merge_attn(o_a, lse_a, o_b, lse_b, tensor_layout)
