"""runtime/allreduce.py on CPU: the modes, and the refusals that name what is wrong. The sums
themselves run in every TP test (gloo here; NCCL and the one-shot kernel in test_gpu_tp.py)."""
import pytest
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.allreduce import Reducer
from dynspec.runtime.distributed import init_tp


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
