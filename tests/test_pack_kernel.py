"""pack_kernel.py's Triton kernel under Triton's interpreter (skipped without triton, which is not
a dependency): the module docstring's worked example, and random row layouts against a reference
written from the rule (a decode row's token j: pending or draft j-1, position pos + j, K/V at its
table's block)."""
import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture
def pack(monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction

    from dynspec.runtime.engines.reference import pack_kernel

    if not isinstance(pack_kernel._pack, InterpretedFunction):
        monkeypatch.setattr(pack_kernel, "_pack", InterpretedFunction(pack_kernel._pack.fn))
    return pack_kernel.pack_inputs


def _run(pack, cell, x, D, pos, slot, tables, bs, staged, device="cpu"):
    on = lambda t: None if t is None else t.to(device)                      # noqa: E731
    staged = tuple(on(s) for s in staged)
    out = tuple(torch.full_like(s, -7) for s in staged)
    pack(on(torch.tensor(cell)), on(x), on(D), on(pos), on(slot), on(tables), bs, staged, out)
    return [o.tolist() for o in out]


def test_the_docstring_example(pack):
    staged = tuple(torch.tensor([0, 0, v, 0, 0]) for v in (99, 42, 1234))      # s2, p2, w2
    tables = torch.tensor([[3, 4], [3, 4]])
    got = _run(pack, [0, 1, -1, 2, 3], torch.tensor([7, 8]), torch.tensor([[5], [6]]), torch.tensor([10, 20]),
               torch.tensor([0, 1]), tables, 16, staged)
    assert got == [[7, 5, 99, 8, 6], [10, 11, 42, 20, 21], [58, 59, 1234, 68, 69]]


@pytest.mark.parametrize("B, T, extra", [(0, 1, 5), (1, 1, 0), (3, 1, 7), (4, 3, 9), (2, 5, 130)])
def test_random_layouts_follow_the_rule(pack, B, T, extra, device="cpu"):
    g = torch.Generator().manual_seed(B * 10 + T)
    bs, blocks, slots = 16, 6, max(8, B)                 # a slot per row (compiled, a short SLOT reads out of bounds)
    tables = torch.randint(1, 50, (slots, blocks), generator=g)
    slot = torch.randperm(slots, generator=g)[:B]
    pos = torch.randint(0, bs * blocks - T, (B,), generator=g)
    x = torch.randint(0, 1000, (B,), generator=g)
    D = torch.randint(0, 1000, (B, T - 1), generator=g) if T > 1 else None
    n = B * T + extra
    cell = torch.full((n,), -1)
    cell[torch.randperm(n, generator=g)[:B * T]] = torch.randperm(B * T, generator=g)
    staged = tuple(torch.randint(0, 1000, (n,), generator=g) for _ in range(3))
    got = _run(pack, cell.tolist(), x, D, pos, slot, tables, bs, staged, device)
    for i, c in enumerate(cell.tolist()):
        if c < 0:
            assert [o[i] for o in got] == [int(s[i]) for s in staged]
            continue
        r, j = divmod(c, T)
        p = int(pos[r]) + j
        want = (int(x[r]) if j == 0 else int(D[r, j - 1]), p, int(tables[slot[r], p // bs]) * bs + p % bs)
        assert tuple(o[i] for o in got) == want
