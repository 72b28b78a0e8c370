"""The hand-written Triton kernels compiled for the H200 (sm_90) on CPU, to PTX and through ptxas
to a cubin. The interpreter (tests/test_ragged_attention.py, test_rope_kernel.py,
test_norm_kernel.py, test_swiglu_kernel.py) runs a kernel's Python, not Triton's type rules: a name reused with another
type inside a loop or branch passes there and fails only on the GPU; ptxas sees what the
interpreter cannot (register and shared-memory use)."""
import pytest

pytest.importorskip("triton")
nvidia = pytest.importorskip("triton.backends.nvidia.compiler")

SHARED_MAX = 227 * 1024      # bytes of shared memory one block of an sm_90 kernel may use


def lower(fn, pointers: dict, scalars: dict, const: dict) -> str:
    """fn compiled for sm_90: pointers {arg: "*bf16"}, scalars {arg: "i64"}, const {arg: value};
    every argument of fn named once. Returns its Triton IR, after checking that ptxas made a cubin
    within the block's shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {**pointers, **scalars, **{c: "constexpr" for c in const}}
    assert sorted(sig) == sorted(fn.arg_names), sorted(set(fn.arg_names) ^ set(sig))
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32))
    assert k.asm["cubin"] and 0 <= k.metadata.shared <= SHARED_MAX, k.metadata.shared
    return k.asm["ttir"]


@pytest.mark.parametrize("uniform,rope,T", [(True, True, 1), (True, False, 4), (True, True, 4), (False, False, 4)])
def test_ragged_attention_lowers_for_sm90(uniform, rope, T):
    """Uniform rows (decode steps, with and without RoPE inside) and work items (ragged batches)."""
    from dynspec.runtime.engines.reference.ragged_kernel import ragged_paged_attention as fn

    pointers = {a: "*bf16" for a in ("Q", "K", "V", "O", "QKV", "COS", "SIN")}
    pointers.update(TABLES="*i64", QPOS="*i64", WIDX="*i64", ITEMS="*i64", PART="*fp32", ML="*fp32", COUNT="*i32")
    scalars = {a: "i64" for a in fn.arg_names if a.startswith("stride")}
    scalars.update(n_tiles="i64", n_items="i64", splits="i64", per="i64", scale="fp32")
    const = dict(T=T, G=4, KVH=8, HD=128, BS=128, TILE_N=64, BLOCK_M=max(16, 4 * T),       # the 8B's shapes,
                 SPLITS=17 if uniform else 0, SPLITS_P2=32 if uniform else 16,             # 1024 context
                 PER=1 if uniform else 0, ROPE=rope, UNIFORM=uniform, IEEE=False)
    assert "tt.func" in lower(fn, pointers, scalars, const)


@pytest.mark.parametrize("n_heads", [32, 0])
def test_rope_write_lowers_for_sm90(n_heads):
    """The target's form, and the draft's keep-warm K/V write (no query heads)."""
    from dynspec.runtime.engines.reference.rope_kernel import _rope_write_kernel as fn

    pointers = {a: "*bf16" for a in ("qkv", "cos", "sin", "q", "k_pool", "v_pool")}
    pointers["write_index"] = "*i64"
    scalars = {a: "i64" for a in ("qkv_row", "cs_row", "k_head", "k_pos", "v_head", "v_pos")}
    const = dict(N_HEADS=n_heads, N_KV_HEADS=8, HEAD_DIM=128, BLOCK=64)
    assert "tt.func" in lower(fn, pointers, scalars, const)


def test_pack_lowers_for_sm90():
    from dynspec.runtime.engines.reference.pack_kernel import _pack as fn

    pointers = {a: "*i64" for a in ("CELL", "X", "D", "POS", "SLOT", "TABLES", "IN_TOK", "IN_POS", "IN_WRITE",
                                    "TOK", "P", "W")}
    scalars = {a: "i64" for a in ("n", "T", "stride_d", "stride_t")}
    assert "tt.func" in lower(fn, pointers, scalars, dict(BS=128, BLOCK=128))


@pytest.mark.parametrize("has_r", [True, False])
def test_norm_lowers_for_sm90(has_r):
    from dynspec.runtime.engines.reference.norm_kernel import _add_rms_norm_kernel as fn

    pointers = {a: "*bf16" for a in ("X", "R", "W", "Y", "H")}
    scalars = {a: "i64" for a in ("stride_x", "stride_r", "stride_y", "stride_h", "n")}
    scalars["eps"] = "fp32"
    const = dict(HAS_R=has_r, WIDE=False, BLOCK=4096)
    assert "tt.func" in lower(fn, pointers, scalars, const)



@pytest.mark.parametrize("t", ["*bf16", "*fp32", "*fp64"])
def test_swiglu_lowers_for_sm90(t):
    from dynspec.runtime.engines.reference.swiglu_kernel import BLOCK, _silu_mul_kernel as fn

    wide = t == "*fp64"
    pointers = {"X": t, "Y": t}
    scalars = {a: "i64" for a in ("n", "stride_x", "stride_y")}
    assert "tt.func" in lower(fn, pointers, scalars, dict(WIDE=wide, BLOCK=BLOCK))


@pytest.mark.parametrize("ranks", [2, 8])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_allreduce_norm_compiles_for_sm90(ranks, dtype):
    """fused_allreduce_norm's kernel compiled to PTX for sm_90 (ptxas included): the barrier's
    flags are compare-and-swaps at system scope, release to the peers and acquire on its own, by
    one thread; every row load and store is 16 bytes wide once the launcher has seen 16-byte
    aligned pointers and widths (slot offsets included, tl.multiple_of), none element-wise."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dynspec.runtime.engines.reference.fused_allreduce_norm import _allreduce_add_rms_norm_kernel as fn

    sig = {a: f"*{dtype}" for a in ("X", "SLOT", "R", "W", "Y", "H")}
    sig.update(PEERS="*i64", SIG="*i32", SIG_PEERS="*i64", eps="fp32")
    sig.update({a: "i32" for a in ("stride_x", "stride_r", "stride_y", "stride_h", "rows", "n")})
    const = dict(RANK=1, RANKS=ranks, COPY=True, SYNC=True, BLOCK=4096)
    sig.update({c: "constexpr" for c in const})
    aligned = [a for a in fn.arg_names if sig[a].startswith("*") or a.startswith("stride") or a == "n"]
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    ptx = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert len(re.findall(r"@%p\d+ atom\.global\.release\.sys\.cas\.b32", ptx)) == 2 * ranks
    assert len(re.findall(r"@%p\d+ atom\.global\.acquire\.sys\.cas\.b32", ptx)) == 2 * ranks
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx) and re.search(r"st\.global(\.\w+)*\.v4\.b32", ptx)
    assert not re.search(r"ld\.global(\.\w+)*\.b16 ", ptx) and not re.search(r"st\.global(\.\w+)*\.b16 ", ptx)
