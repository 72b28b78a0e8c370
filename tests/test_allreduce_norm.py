"""fused_allreduce_norm.py's kernel == the unfused path (the partial sums in rank order, then
layer_ops.add_rms_norm), N = 2 and 4, float32 and bfloat16, on CPU under Triton's interpreter, one
process standing in for the ranks; and its barrier's flags (skipped without triton; the kernel
across two GPUs: tests/test_gpu_tp.py)."""
import importlib.util

import pytest

from tests.helpers_allreduce_norm import CASES
from tests.interpreted import interpreted


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_allreduce_add_rms_norm_interpreted_equals_unfused():
    out = interpreted("helpers_allreduce_norm", "run_interpreted")
    assert out.count("ok") == 2 * (2 * len(CASES) + 1) and out.count("ok flags") == 2
