"""rope_kernel.py's Triton kernel == layer_ops.rope_write, on CPU under Triton's interpreter (skipped
without triton, which is not a dependency; test_gpu.py runs it compiled on CUDA)."""
import importlib.util

import pytest
import torch

from tests.helpers_rope import assert_rope_write_matches

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n, nh, kvh, hd", [(1, 32, 8, 128), (7, 32, 8, 128), (5, 4, 2, 80), (3, 0, 2, 64)])
def test_rope_write_triton_interpreted_equals_rope_write(n, nh, kvh, hd, dtype, monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction

    from dynspec.runtime.engines.reference import rope_kernel

    kernel = rope_kernel._rope_write_kernel
    if not isinstance(kernel, InterpretedFunction):
        monkeypatch.setattr(rope_kernel, "_rope_write_kernel", InterpretedFunction(kernel.fn))
    assert_rope_write_matches(rope_kernel.rope_write_triton, "cpu", dtype, n, nh, kvh, hd)
