"""Context parallelism (sparge.dist) on 2 GPUs against single-GPU sparge on the same inputs.

Two processes (torch.multiprocessing, one GPU each, NCCL process group). Every rank builds the same
full inputs, runs sparge.dist.sparge_attn on its zigzag shard, and compares its rows with
single-GPU block_map + block_sparse_attn (pvthreshd=None) on the whole sequence, computed on its own
GPU: the block-map rows (LUT and counts) must be identical, O and LSE within the kernels' rounding
(O NMSE <= 1e-5, |dLSE| <= 2e-4, as tests/dist/dist_test.cpp). Then the failure case: rank 1 never
calls, rank 0 must raise within its timeout (plus slack). Skips without 2 GPUs or without NCCL.
"""

import os
import socket
import tempfile
import time
import traceback

import pytest
import torch

import sparge

# NVLink multicast off (NCCL NVLS, torch symmetric memory, NVSHMEM): the lent GPU hosts require it.
for _var in ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(_var, "0" if _var == "NCCL_NVLS_ENABLE" else "1")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

WORLD = 2

_REASONS = [
    (not (torch.cuda.is_available() and torch.cuda.device_count() >= WORLD), f"needs {WORLD} CUDA devices"),
    (not sparge.cuda_available(), "sparge built without CUDA"),
    (not sparge.dist.available(), "sparge built without NCCL"),
    (not torch.distributed.is_available() or not torch.distributed.is_nccl_available(), "torch without NCCL"),
]
needs_gpus = pytest.mark.skipif(any(c for c, _ in _REASONS), reason="; ".join(r for c, r in _REASONS if c) or "-")

# (name, S, hq, hk, d, dtype, causal, selection); S = 3000 leaves a short last chunk (tail).
CASES = [
    ("s4096_causal_topk0.4", 4096, 2, 2, 128, torch.float16, True, {"topk": 0.4}),
    ("s4096_noncausal_topk1.0", 4096, 2, 2, 128, torch.float16, False, {"topk": 1.0}),
    ("s4096_causal_topk0.1", 4096, 2, 2, 64, torch.float16, True, {"topk": 0.1}),
    ("s3000_gqa_causal_topk1.0", 3000, 4, 2, 64, torch.float16, True, {"topk": 1.0}),
    ("s3000_gqa_noncausal_topk0.4_bf16", 3000, 4, 2, 128, torch.bfloat16, False, {"topk": 0.4}),
    ("s3000_gqa_causal_topk0.1_blk128", 3000, 4, 2, 128, torch.float16, True, {"topk": 0.1, "blkq": 128}),
    ("s4096_causal_cdf0.9", 4096, 2, 1, 128, torch.float16, True, {"cdfthreshd": 0.9}),
]
O_NMSE_MAX = {torch.float16: 1e-5, torch.bfloat16: 3e-5}  # bf16 outputs: a rare 1-ulp difference
LSE_MAX = 2e-4


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank, port):
    torch.cuda.set_device(rank)
    torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=WORLD, device_id=torch.device("cuda", rank))


def _global_rows(seq_len, rank):
    return torch.cat([torch.arange(gb, gb + n) for gb, n in sparge.dist.shard_of(seq_len, WORLD, rank)])


def _check_case(rank, case):
    name, s, hq, hk, d, dtype, causal, sel = case
    sel = dict(sel)
    blkq = sel.pop("blkq", 64)
    blkk = sel.pop("blkk", 64)
    dev = torch.device("cuda", rank)
    gen = torch.Generator().manual_seed(s + hq * 7 + d + int(causal))
    q = torch.randn(1, hq, s, d, generator=gen).to(dtype).to(dev)
    k = torch.randn(1, hk, s, d, generator=gen).to(dtype).to(dev)
    v = torch.randn(1, hk, s, d, generator=gen).to(dtype).to(dev)
    sim = -0.1 if "topk" in sel else 0.6

    lut, counts = sparge.block_map(q, k, simthreshd1=sim, blkq=blkq, blkk=blkk, is_causal=causal, **sel)
    o_ref, lse_ref = sparge.block_sparse_attn(q, k, v, lut, counts, blkq=blkq, blkk=blkk, is_causal=causal,
                                              pvthreshd=None, return_lse=True)

    q_l, k_l, v_l = (sparge.dist.shard(t, dim=2) for t in (q, k, v))
    o_l, lse_l, lut_l, counts_l = sparge.dist.sparge_attn(q_l, k_l, v_l, simthreshd1=sim, is_causal=causal,
                                                          return_lse=True, return_block_map=True, blkq=blkq,
                                                          blkk=blkk, timeout=60.0, **sel)
    torch.cuda.synchronize()
    rows = _global_rows(s, rank).to(dev)
    assert o_l.shape == (1, hq, rows.numel(), d) and o_l.dtype == dtype, f"{name}: o {o_l.shape} {o_l.dtype}"

    # Block map: local query block j starts at local row j * blkq, whose global row gives the block.
    nql = (rows.numel() + blkq - 1) // blkq
    gblk = rows[torch.arange(nql, device=dev) * blkq] // blkq
    assert torch.equal(counts_l, counts[:, :, gblk]), f"{name}: rank {rank} block-map counts differ"
    assert torch.equal(lut_l, lut[:, :, gblk]), f"{name}: rank {rank} LUT rows differ"

    ref = o_ref[:, :, rows].float()
    nmse = float(((o_l.float() - ref) ** 2).mean() / (ref ** 2).mean().clamp_min(1e-30))
    assert nmse <= O_NMSE_MAX[dtype], f"{name}: rank {rank} O NMSE {nmse:.3e} > {O_NMSE_MAX[dtype]}"
    lr, ll = lse_ref[:, :, rows], lse_l
    assert torch.equal(torch.isinf(lr), torch.isinf(ll)), f"{name}: rank {rank} -inf LSE rows differ"
    fin = torch.isfinite(lr)
    dl = float((lr[fin] - ll[fin]).abs().max()) if fin.any() else 0.0
    assert dl <= LSE_MAX, f"{name}: rank {rank} max |dLSE| {dl:.3e} > {LSE_MAX}"

    # unshard is the inverse of shard (and the gathered O equals the reference up to the same bound).
    assert torch.equal(sparge.dist.unshard(q_l, dim=2, seq_len=s), q), f"{name}: unshard(shard(q)) != q"
    assert torch.equal(sparge.dist.unshard(o_l, dim=2)[:, :, rows], o_l), f"{name}: unshard of o"
    return f"{name}: nmse {nmse:.2e} dlse {dl:.2e}"


def _worker_correctness(rank, port, out_dir):
    lines = []
    try:
        _init(rank, port)
        for case in CASES:
            lines.append(_check_case(rank, case))
        # Validation errors raise before any communication and leave the communicator usable.
        q = torch.randn(1, 2, 4096 // WORLD, 64, device="cuda", dtype=torch.float16)
        with pytest.raises(ValueError, match="seq_len"):
            sparge.dist.sparge_attn(q, q, q, seq_len=100, topk=0.5)  # L = 2048 fits no rank
        lines.append(_check_case(rank, CASES[0]))
        sparge.dist.release()
        torch.distributed.destroy_process_group()
        status = "ok"
    except BaseException:  # noqa: BLE001 - reported to the parent
        status = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(status + "\n" + "\n".join(lines))


def _worker_failure(rank, port, out_dir, timeout):
    status = "ok"
    info = ""
    try:
        _init(rank, port)
        s = 4096
        q = torch.randn(1, 2, s, 64, device="cuda", dtype=torch.float16)
        ql = sparge.dist.shard(q, dim=2)
        sparge.dist.sparge_attn(ql, ql, ql, topk=0.5, timeout=60.0, seq_len=s)  # both ranks: comm up
        torch.cuda.synchronize()
        torch.distributed.barrier()
        if rank == 0:
            t0 = time.monotonic()
            try:
                sparge.dist.sparge_attn(ql, ql, ql, topk=0.5, timeout=timeout, seq_len=s)
                torch.cuda.synchronize()
                status = "rank 0: no error although rank 1 never called"
            except RuntimeError as e:
                took = time.monotonic() - t0
                info = f"rank 0 raised after {took:.1f} s: {str(e).splitlines()[0][:300]}"
                if "timed out" not in str(e):
                    status = "rank 0: unexpected error: " + str(e)[:500]
                elif took > timeout + 10.0:
                    status = f"rank 0: raised after {took:.1f} s > timeout {timeout} + 10 s"
            torch.cuda.synchronize()  # the aborted communicator's kernels have ended
        # The group's own communicator is untouched by sparge's abort.
        torch.distributed.barrier()
        sparge.dist.release(abort=True)
        torch.distributed.destroy_process_group()
    except BaseException:  # noqa: BLE001
        status = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(status + "\n" + info)


def _spawn(fn, extra_args, limit_s):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(fn, args=(_free_port(), out_dir, *extra_args), nprocs=WORLD, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + limit_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the {WORLD} processes did not finish within {limit_s} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        reports = []
        for r in range(WORLD):
            path = os.path.join(out_dir, f"rank{r}.txt")
            assert os.path.exists(path), f"rank {r} wrote no report"
            with open(path) as f:
                reports.append(f.read())
    for r, rep in enumerate(reports):
        print(f"--- rank {r}\n{rep}")
    for r, rep in enumerate(reports):
        assert rep.startswith("ok"), f"rank {r}:\n{rep}"


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("seq_len", [1, 1000, 1024, 1500, 3000, 4096, 8192, 10000])
def test_shard_of_is_a_zigzag_partition(world, seq_len):
    """CPU: the pieces of all ranks cover [0, S) once; rank r holds chunk r then chunk 2R-1-r."""
    chunk = -(-seq_len // (2 * world))
    chunk = -(-chunk // 1024) * 1024
    covered = []
    for r in range(world):
        pieces = sparge.dist.shard_of(seq_len, world, r)
        for (gb, n), c in zip(pieces, (r, 2 * world - 1 - r)):
            want_gb = min(c * chunk, seq_len)
            assert gb == want_gb or n == 0, f"rank {r}: piece at {gb}, expected chunk {c} at {want_gb}"
            assert n == max(0, min(seq_len, (c + 1) * chunk) - c * chunk), f"rank {r} chunk {c}: {n} rows"
            covered += range(gb, gb + n)
        x = torch.arange(seq_len).view(1, 1, seq_len, 1)
        got = sparge.dist.shard(x, dim=2, rank=r, world=world).flatten().tolist()
        assert got == [i for gb, n in pieces for i in range(gb, gb + n)], f"rank {r}: shard rows"
    assert sorted(covered) == list(range(seq_len))


@needs_gpus
def test_dist_matches_single_gpu():
    _spawn(_worker_correctness, (), 240.0)


@needs_gpus
def test_dist_peer_missing_raises_within_timeout():
    _spawn(_worker_failure, (5.0,), 120.0)
