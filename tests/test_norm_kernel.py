"""norm_kernel.py's Triton kernel == layer_ops.add_rms_norm / rms_norm, on CPU under Triton's
interpreter (skipped without triton; test_gpu.py runs it compiled on CUDA)."""
import importlib.util

import pytest

from tests.helpers_norm import CASES
from tests.interpreted import interpreted


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_add_rms_norm_triton_interpreted_equals_eager():
    assert interpreted("helpers_norm", "run_interpreted").count("ok") == 3 * len(CASES)
