"""The check of fused_allreduce_norm.py's kernel under Triton's interpreter (one process standing in
for N ranks): the oracle is the unfused path, the partial sums added in rank order at the dtype,
then layer_ops.add_rms_norm. Run with TRITON_INTERPRET=1 set before Triton is imported
(tests/test_allreduce_norm.py)."""
from __future__ import annotations

import torch

from dynspec.runtime.engines.reference.layer_ops import add_rms_norm, rms_norm

CASES = [(1, 4096), (5, 64), (3, 80), (70, 32)]  # rows, n: the 8B's b=1 row, a tiny model's, not a power of two,
                                                 # more rows than programs (70 > MAX_PROGRAMS: rows p, p + 64)


def inputs(ranks: int, rows: int, n: int, dtype: torch.dtype):
    """(parts [ranks, rows, n], residual r [rows, n], weight [n]), seeded by the case."""
    g = torch.Generator().manual_seed(ranks * 100000 + rows * 1000 + n)
    parts = (4 * torch.randn(ranks, rows, n, generator=g)).to(dtype)
    r = torch.randn(rows, n, generator=g).to(dtype)
    w = (1 + torch.randn(n, generator=g) / 4).to(dtype)
    return parts, r, w


def unfused(parts: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = parts[0].clone()
    for p in parts[1:]:
        s = s + p                                        # rank order, rounded at the dtype each time
    return add_rms_norm(r, s, w, eps)


def offsets(base: torch.Tensor, tensors: list[torch.Tensor]) -> torch.Tensor:
    """[len(tensors)] int64: each tensor's element offset from base (what PEERS / SIG_PEERS hold)."""
    size = base.element_size()
    d = [t.data_ptr() - base.data_ptr() for t in tensors]
    assert all(b % size == 0 for b in d)
    return torch.tensor([b // size for b in d], dtype=torch.int64)


def check(ranks: int, rows: int, n: int, dtype: torch.dtype, rank: int) -> None:
    """Rank `rank`'s view: N separate slot tensors (peers at arbitrary offsets, as mapped peer
    buffers are), this rank's partial copied in by the kernel, the peers' already there."""
    from dynspec.runtime.engines.reference.fused_allreduce_norm import allreduce_add_rms_norm

    parts, r, w = inputs(ranks, rows, n, dtype)
    eps = 1e-5
    slots = [torch.full((rows * n + 64,), float("nan"), dtype=dtype) for _ in range(ranks)]
    for q in range(ranks):
        if q != rank:
            slots[q][: rows * n] = parts[q].reshape(-1)
    flags = [torch.zeros(4, dtype=torch.int32)]
    y, h = allreduce_add_rms_norm(parts[rank], r, w, eps, slots[rank], offsets(slots[rank], slots), flags[0],
                                  torch.zeros(ranks, dtype=torch.int64), rank, ranks, sync=False)
    y_ref, h_ref = unfused(parts, r, w, eps)
    assert torch.equal(slots[rank][: rows * n], parts[rank].reshape(-1))          # copied into its slot
    if dtype == torch.float32:
        assert torch.equal(y, y_ref), (y - y_ref).abs().max()
        torch.testing.assert_close(h, h_ref, rtol=1e-6, atol=1e-6)
    else:
        # the interpreter truncates where CUDA rounds (helpers_norm): each of the N roundings of the
        # running sum and of the add may be 1 ulp (2**-7) off, per element of at most sum |x_q| + |r|;
        # the norm of the kernel's own y within helpers_norm's 3 ulp
        bound = (ranks + 1) * 2 ** -7 * (parts.float().abs().sum(0) + r.float().abs())
        assert ((y.float() - y_ref.float()).abs() <= bound).all()
        torch.testing.assert_close(h, rms_norm(y, w, eps), rtol=2 ** -5, atol=2 ** -6)


def check_flags(ranks: int, rank: int, rows: int) -> None:
    """The barrier's flags, one rank run alone: its own pad preset as if every peer had signalled
    both phases of every program (flag [c * N + q] = 1, q != rank), the peers' pads zero. After
    the kernel its own flags are all taken (0) and it has signalled each peer once per cell
    (flag [c * N + rank] = 1 on every peer's pad, c < 2G), and nothing outside the region moved."""
    from dynspec.runtime.engines.reference.fused_allreduce_norm import MAX_PROGRAMS, allreduce_add_rms_norm

    G = min(rows, MAX_PROGRAMS)
    parts, r, w = inputs(ranks, rows, 16, torch.float32)
    slots = [parts[q].reshape(-1).clone() for q in range(ranks)]
    pads = [torch.zeros(2 * G * ranks + 8, dtype=torch.int32) for _ in range(ranks)]
    mine = pads[rank][: 2 * G * ranks].view(2 * G, ranks)
    mine[:] = 1
    mine[:, rank] = 0
    y, h = allreduce_add_rms_norm(parts[rank], r, w, 1e-5, slots[rank], offsets(slots[rank], slots), pads[rank],
                                  offsets(pads[rank], pads), rank, ranks, copy=False)
    assert torch.equal(pads[rank], torch.zeros_like(pads[rank]))
    for q in range(ranks):
        if q != rank:
            got = pads[q][: 2 * G * ranks].view(2 * G, ranks)
            want = torch.zeros_like(got)
            want[:, rank] = 1
            assert torch.equal(got, want) and not pads[q][2 * G * ranks:].any()
    y_ref, h_ref = unfused(parts, r, w, 1e-5)
    assert torch.equal(y, y_ref)


def run_interpreted() -> None:
    for ranks in (2, 4):
        for dtype in (torch.float32, torch.bfloat16):
            for rows, n in CASES:
                check(ranks, rows, n, dtype, rank=ranks - 1)
                print("ok", ranks, dtype, rows, n)
        check_flags(ranks, rank=1, rows=3)
        print("ok flags", ranks)
