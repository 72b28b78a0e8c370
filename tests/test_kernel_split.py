"""benchmarks/kernel_split.py: a step's kernels by GEMMs, attention and the rest, and the floor of a
mixed / decode ratio, on a hand-made record and on the committed H100 mixed_step run."""
import json
from pathlib import Path

import pytest

from dynspec.benchmarks.kernel_split import kind, point_split, split

ROOT = Path(__file__).resolve().parents[1]


def _record(top, kernel_us, wall_us):
    return {"top": [{"name": n, "calls": 1, "us": us} for n, us in top], "kernel_us_per_step": kernel_us,
            "wall_us_per_step": wall_us}


def test_kinds_of_kernel_names():
    assert kind("nvjet_sm90_tst_128x192_64x5_2x1_v_bz_coopB_TNN") == "gemm"
    assert kind("void cublasLt::splitKreduce_kernel<32, 16, int, float>") == "gemm"
    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert kind("void cublasLt::gemv2T_kernel_val<int, int, __nv_bfloat16>") == "gemm"
    assert kind("ragged_paged_attention") == "attention"
    assert kind("fmha_cutlassF_bf16_aligned_64x128_rf_sm80") == kind("flash_fwd_kernel") == "attention"  # eager SDPA
    assert kind("_add_rms_norm_kernel") == kind("_silu_mul_kernel") == kind("Memcpy HtoD (Pinned -> Device)") == "rest"


def test_split_worked_example():
    """GEMMs 6 + 1 ms, attention 2, the listed rest 0.5 and 0.5 unlisted (a top-N list), wall 11 ms:
    the rest is what the kernel time leaves, and the floor = (7 + decode's 10 - 5) / 10."""
    mixed = _record([("nvjet_a", 6000), ("ragged_paged_attention", 2000), ("splitKreduce", 1000),
                     ("_rope_write_kernel", 500)], 10_000, 11_000)
    assert split(mixed) == {"gemm_ms": 7.0, "attention_ms": 2.0, "rest_ms": 1.0, "kernel_ms": 10.0, "wall_ms": 11.0}
    decode = _record([("nvjet_b", 5000), ("ragged_paged_attention", 2000)], 8000, 10_000)
    s = point_split({"full_kernels": mixed, "decode_kernels": decode})
    assert s["decode"]["rest_ms"] == 1.0 and s["gemm_floor"] == pytest.approx(1.2)
    assert point_split({"full_kernels": mixed}) is None                        # no decode timing: no split


def test_the_committed_h100_run_splits_into_its_kernel_time():
    """Every point of the committed mixed_step run: the parts add up to its kernel time, and the
    floor sits below the measured ratio (the chunk adds more than GEMMs)."""
    doc = json.loads((ROOT / "benchmarks" / "results" / "mixed_step" / "mixed.json").read_text())
    for p in doc["points"]:
        s = point_split(p)
        for part in ("mixed", "decode"):
            x = s[part]
            assert x["gemm_ms"] + x["attention_ms"] + x["rest_ms"] == pytest.approx(x["kernel_ms"])
            assert 0 < x["kernel_ms"] < x["wall_ms"]
        measured = p["full_kernels"]["wall_us_per_step"] / p["decode_kernels"]["wall_us_per_step"]
        assert 1.0 < s["gemm_floor"] < measured, p["point"]
