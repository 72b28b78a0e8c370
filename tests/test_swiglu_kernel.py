"""swiglu_kernel.py's Triton kernel == layer_ops.silu_mul, on CPU under Triton's interpreter
(skipped without triton; test_gpu.py runs it compiled on CUDA)."""
import importlib.util

import pytest

from tests.helpers_swiglu import CASES
from tests.interpreted import interpreted


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_silu_mul_triton_interpreted_equals_eager():
    assert interpreted("helpers_swiglu", "run_interpreted").count("ok") == 3 * len(CASES)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_silu_mul_triton_refuses_an_odd_width():
    import torch

    from dynspec.runtime.engines.reference.swiglu_kernel import silu_mul_triton

    with pytest.raises(ValueError, match=r"\[\.\., 2i\].*shape \(2, 5\)"):
        silu_mul_triton(torch.zeros(2, 5))
