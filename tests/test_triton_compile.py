"""paged_decode's kernel lowered to Triton IR for the H200 (sm_90) on CPU: the interpreter runs the
kernel's Python, not Triton's type rules, so a name reused with another type inside a loop or branch
passed tests/test_paged_decode.py and failed only on the GPU (calls of 2026-12-01, ninth session)."""
import pytest

pytest.importorskip("triton")
nvidia = pytest.importorskip("triton.backends.nvidia.compiler")


@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("T", [1, 4])
def test_paged_decode_lowers_for_sm90(rope, T):
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dynspec.runtime.engines.reference.paged_decode_kernel import paged_decode

    ptr = {"TABLES": "*i64", "QPOS": "*i64", "WIDX": "*i64", "PART": "*fp32", "ML": "*fp32", "COUNT": "*i32"}
    sig = {}
    for a in paged_decode.arg_names:
        if a.isupper() and a not in ("T", "G", "KVH", "HD", "BS", "TILE_N", "BLOCK_M", "SPLITS", "SPLITS_P2", "PER",
                                     "MQ", "ROPE", "IEEE"):
            sig[a] = ptr.get(a, "*bf16")
    sig.update({a: "i64" for a in paged_decode.arg_names if a.startswith("stride") or a == "n_tiles"})
    sig["scale"] = "fp32"
    const = dict(T=T, G=4, KVH=8, HD=128, BS=128, TILE_N=64, BLOCK_M=max(16, 4 * T), SPLITS=17, SPLITS_P2=32,
                 PER=1, MQ=4 * T, ROPE=rope, IEEE=False)           # the 8B's shapes at b=1, 1024 context
    for c in const:
        sig.pop(c, None)
    sig.update({c: "constexpr" for c in const})
    missing = [a for a in paged_decode.arg_names if a not in sig]
    assert not missing, missing
    target = GPUTarget("cuda", 90, 32)
    backend = nvidia.CUDABackend(target)
    opts = backend.parse_options({})
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    mod = ASTSource(fn=paged_decode, signature=sig, constexprs=const).make_ir(
        target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), ctx)
    assert "tt.func" in str(mod)
