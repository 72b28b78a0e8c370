"""Where a step's time goes, from the kernel timing of `step_timing.step_kernels` (the `mixed_step`
run's `<mode>_kernels`): GEMMs, attention, the rest of the kernels, and the wall time outside
them. Pure functions (docs/design.md, "One packed forward": "Where the time goes").

A kernel is attention when it is the ragged kernel or a fused SDPA one (`fmha*`, `flash*`: the
eager path's), a GEMM when cuBLAS ran it (`nvjet_*`, `*gemm*` and `*gemv*`, `cutlass*`, cuBLASLt's
split-K reduce that finishes one); everything else (the norms, RoPE with
the K/V write, SwiGLU, the packing, torch's index ops, copies) is the rest. The rest is what the
listed kernels leave of the step's kernel time, so a list cut at its top N still adds up.

The floor of a mixed / decode ratio (`gemm_floor`): the mixed step if its prompt chunk added
nothing but its share of the GEMMs, (mixed GEMMs + the decode step's attention, rest and wall
outside kernels) / the decode step's wall, in the profiler's clock (the timed ratio, without the
profiler, may differ by a few percent: 2.02 timed, 1.96 profiled at 64:0:512 on the H100 at
7dfc4b1).
Worked example, the H100's 64:0:512 mixed step at 1bfbb10 (ms a step): GEMMs 12.25, attention
4.06, rest 2.10 (18.41 of kernels), wall 19.43; its decode step 5.62, 3.04, 0.36 (9.02), wall
9.54. gemm_floor = (12.25 + 3.04 + 0.36 + 0.52) / 9.54 = 1.70 (measured 2.03): a target of 1.7
there leaves the chunk's 512 tokens about 0.05 ms for their attention, norms, RoPE and SwiGLU.
"""
from __future__ import annotations

from typing import Mapping

ATTENTION_MARKS = ("ragged_paged_attention", "fmha", "flash")
GEMM_MARKS = ("nvjet_", "gemm", "gemv", "cutlass", "splitkreduce")


def kind(name: str) -> str:
    """'gemm', 'attention' or 'rest' of one kernel name."""
    low = name.lower()
    if any(m in low for m in ATTENTION_MARKS):
        return "attention"
    return "gemm" if any(m in low for m in GEMM_MARKS) else "rest"


def split(kernels: Mapping) -> dict:
    """{"gemm_ms", "attention_ms", "rest_ms", "kernel_ms", "wall_ms"} a step, from one mode's
    step_kernels record ({"kernel_us_per_step", "wall_us_per_step", "top": [{"name", "us"}]})."""
    by = {"gemm": 0.0, "attention": 0.0}
    for k in kernels["top"]:
        if (part := kind(k["name"])) in by:
            by[part] += k["us"]
    total = float(kernels["kernel_us_per_step"])
    return {"gemm_ms": by["gemm"] / 1e3, "attention_ms": by["attention"] / 1e3,
            "rest_ms": max(total - by["gemm"] - by["attention"], 0.0) / 1e3, "kernel_ms": total / 1e3,
            "wall_ms": float(kernels["wall_us_per_step"]) / 1e3}


def point_split(point: Mapping, mixed_mode: str = "full") -> dict | None:
    """{"mixed": split, "decode": split, "gemm_floor": ratio} of one mixed_step point, None
    without kernel timing."""
    m, d = point.get(f"{mixed_mode}_kernels"), point.get("decode_kernels")
    if not m or not d:
        return None
    mixed, dec = split(m), split(d)
    floor = (mixed["gemm_ms"] + dec["wall_ms"] - dec["gemm_ms"]) / dec["wall_ms"] if dec["wall_ms"] > 0 else None
    return {"mixed": mixed, "decode": dec, "gemm_floor": floor}
