"""runtime/tp/allreduce.py on CPU: the modes, and the refusals that name what is wrong. The sums
themselves run in every TP test (gloo here; NCCL and the one-shot kernel in test_gpu_tp.py)."""
import pytest
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.tp.allreduce import Reducer
from dynspec.runtime.tp.tp_groups import init_tp


def test_unknown_mode_is_refused_by_name():
    with pytest.raises(DynspecError, match=r"--allreduce 'fast' is not one of auto, nccl, one-shot, skip"):
        Reducer("fast", None, torch.device("cpu"))
    with pytest.raises(DynspecError, match=r"--allreduce 'fast'"):
        init_tp(1, allreduce="fast")


def test_one_shot_needs_cuda_and_auto_falls_back():
    with pytest.raises(DynspecError, match=r"one-shot cannot be set up on cpu: .*needs CUDA devices, not cpu"):
        Reducer("one-shot", None, torch.device("cpu"))
    r = Reducer("auto", None, torch.device("cpu"))
    assert r.mode == "nccl" and "needs CUDA" in r.fallback


def test_skip_returns_the_partial_sum_untouched():
    x = torch.arange(6.0).view(2, 3)
    assert Reducer("skip", None, torch.device("cpu"))(x) is x


def test_use_switches_only_to_modes_that_were_set_up():
    r = Reducer("nccl", None, torch.device("cpu"))
    r.use("skip")
    assert r.mode == "skip"
    with pytest.raises(DynspecError, match=r"all-reduce mode 'one-shot' is not available here \(set up as 'skip'\)"):
        r.use("one-shot")


def test_one_shot_takes_only_what_its_kernel_can_sum():
    """bf16 / fp32 within the buffer and 16-byte aligned; fp16, fp64, larger or offset tensors
    go to NCCL (torch's one-shot kernel has no fp16 and wants the slot's alignment)."""
    r = Reducer("nccl", None, torch.device("cpu"))
    r.buffer = torch.empty(1024, dtype=torch.uint8)             # what _symmetric_buffer sets up on CUDA
    row = torch.zeros(1, 256, dtype=torch.bfloat16)               # 512 bytes
    assert r.one_shot_fits(row) and r.one_shot_fits(row.float())
    assert not r.one_shot_fits(row.half()) and not r.one_shot_fits(row.double())
    assert not r.one_shot_fits(torch.zeros(2, 512, dtype=torch.bfloat16))            # 2 KiB > 1 KiB
    assert not r.one_shot_fits(torch.zeros(64, dtype=torch.bfloat16)[3:])           # 6-byte offset
    assert r.one_shot_fits(torch.zeros(64, dtype=torch.bfloat16)[8:])               # 16-byte offset


def test_peer_offsets_are_elements_from_this_ranks_buffer_and_aligned():
    from dynspec.runtime.tp.allreduce import peer_offsets

    assert peer_offsets(1000, [1000, 1064, 936], 2) == [0, 32, -32]
    with pytest.raises(DynspecError, match=r"not 16-byte aligned to each other: offsets \[0, 8\]"):
        peer_offsets(1000, [1000, 1008], 4)


def test_the_fused_norm_is_taken_only_for_one_shot_shapes_it_handles():
    """fuses_norm: one-shot with the peers' addresses, fuse_norm on, bf16/fp32 within the buffer,
    part contiguous, r of part's shape, weight [n]. Anything else takes the all-reduce and then the
    model's add_rms_norm: on CPU (gloo) always, as tests/test_tp.py runs it."""
    pytest.importorskip("triton")
    from dynspec.runtime.tp.allreduce import FusedPeers

    r = Reducer("nccl", None, torch.device("cpu"))
    part, res, w = torch.zeros(2, 64), torch.zeros(2, 64), torch.ones(64)
    assert not r.fuses_norm(part, res, w)                                        # nccl
    r.buffer = torch.empty(1024, dtype=torch.uint8)
    r.use("one-shot", fuse_norm=True)
    assert not r.fuses_norm(part, res, w)                                        # no peers' addresses
    r.peers = FusedPeers(0, 2, {}, torch.zeros(1, dtype=torch.int32), torch.zeros(2, dtype=torch.int64))
    assert r.fuses_norm(part, res, w) and r.fuses_norm(part.bfloat16(), res.bfloat16(), w.bfloat16())
    assert not r.fuses_norm(torch.zeros(8, 64), torch.zeros(8, 64), w)           # 2 KiB > 1 KiB
    assert not r.fuses_norm(part.half(), res.half(), w.half())
    assert not r.fuses_norm(part, res[:1], w) and not r.fuses_norm(part, res, w[:32])
    assert not r.fuses_norm(torch.zeros(64, 2).t(), res, w)                      # not contiguous
    r.use("one-shot")                                                            # served: off until measured
    assert not r.fuses_norm(part, res, w)
    r.use("skip")
    x = torch.randn(2, 64)
    y, h = r.add_rms_norm(x, res + 1, w, 1e-5, lambda a, b, wt, e: (a + b, wt * a))   # skip: r + part, unfused
    assert torch.equal(y, res + 1 + x) and torch.equal(h, w * (res + 1))
