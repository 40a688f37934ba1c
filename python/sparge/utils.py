"""Helpers around the LUT format: visible-block counts, LUT <-> block mask, LUT -> token mask.

The LUT format (docs/semantics.md): lut [B, H, NQ, NK] int32 holds each query block's selected key
blocks in ascending order, then -1; counts [B, H, NQ] int32 their number. Everything here is plain
torch, runs on any device and is meant for tests, benchmarks and adapters (FlexAttention BlockMask).
"""

import torch


def num_blocks(n: int, blk: int) -> int:
    return (n + blk - 1) // blk


def visible_blocks_per_row(sq: int, sk: int, blkq: int, blkk: int, is_causal: bool) -> list:
    """NV of each query block: the key blocks some row of it can see (bottom-right causal alignment)."""
    nq, nk = num_blocks(sq, blkq), num_blocks(sk, blkk)
    if not is_causal:
        return [nk] * nq
    out = []
    for qb in range(nq):
        last_row = min((qb + 1) * blkq, sq) - 1
        bound = last_row + sk - sq  # the last key this block's last row sees
        out.append(0 if bound < 0 else min(nk, bound // blkk + 1))
    return out


def visible_blocks(sq: int, sk: int, blkq: int, blkk: int, is_causal: bool) -> int:
    """Sum of NV over the query blocks of one (batch, head)."""
    return sum(visible_blocks_per_row(sq, sk, blkq, blkk, is_causal))


def lut_from_block_mask(block_mask: torch.Tensor):
    """(lut, counts) int32 from a boolean block mask [B, H, NQ, NK] (True = compute the block)."""
    if block_mask.dim() != 4:
        raise ValueError(f"lut_from_block_mask: block_mask has {block_mask.dim()} dimensions (expected 4)")
    bm = block_mask.bool()
    nk = bm.shape[-1]
    idx = torch.arange(nk, device=bm.device, dtype=torch.int32).expand_as(bm)
    # Selected blocks sort before the others, each group ascending by index.
    key = torch.where(bm, idx, idx + nk)
    srt = key.sort(dim=-1).values
    lut = torch.where(srt < nk, srt, torch.full_like(srt, -1)).to(torch.int32).contiguous()
    counts = bm.sum(dim=-1, dtype=torch.int32)
    return lut, counts


def block_mask_from_lut(lut: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Boolean block mask [B, H, NQ, NK] from (lut, counts); entries past counts are ignored."""
    nk = lut.shape[-1]
    valid = torch.arange(nk, device=lut.device) < counts.unsqueeze(-1).long()
    hits = torch.zeros(lut.shape, dtype=torch.int32, device=lut.device)
    # scatter_add, not scatter: the -1 padding (clamped to 0) must not overwrite a selected block 0.
    hits.scatter_add_(-1, lut.long().clamp(min=0), valid.to(torch.int32))
    return hits > 0


def causal_mask(sq: int, sk: int, device=None) -> torch.Tensor:
    """[Sq, Sk] bool, bottom-right aligned: query i sees key j iff j <= i + Sk - Sq."""
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    return j <= i + (sk - sq)


def token_mask_from_lut(lut, counts, sq: int, sk: int, blkq: int, blkk: int, is_causal: bool = False):
    """Boolean token mask [B, H, Sq, Sk] that a block-sparse kernel with this LUT attends."""
    bm = block_mask_from_lut(lut, counts)
    m = bm.repeat_interleave(blkq, dim=2)[:, :, :sq].repeat_interleave(blkk, dim=3)[..., :sk]
    if is_causal:
        m = m & causal_mask(sq, sk, lut.device)
    return m


def density(counts: torch.Tensor, sq: int, sk: int, blkq: int, blkk: int, is_causal: bool) -> float:
    """Computed fraction of the visible blocks: sum(counts) / sum(NV) (docs/semantics.md)."""
    nv = visible_blocks(sq, sk, blkq, blkk, is_causal) * counts.shape[0] * counts.shape[1]
    return float(counts.sum().item()) / nv if nv > 0 else 1.0
