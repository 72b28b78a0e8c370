"""The reference engine's target model: a Llama-family decoder in a few hundred lines.

gpt-fast style: fused q/k/v and gate/up weights, and a paged KV cache (attention.py,
kv_cache.py). `run` takes packed tokens of several rows (decode rows and prompt chunks) and
is CUDA-graph capturable for a fixed batch layout: no `.item()`, no host sync and no
data-dependent Python branches.

Cache semantics (the engine relies on these):
- Each sequence owns a slot whose block table maps its positions to pool blocks. A call
  writes the K/V of every input token at its absolute position.
- A query at position p attends to positions <= p of its own sequence. Entries beyond a
  sequence's length are stale but never read by a query that does not own them, so rolling a
  request back is just "write from the accepted length on" (no clearing).

Tensor parallelism: head counts are per instance (`Block.n_local_heads`, `n_local_kv_heads`),
and the lm_head output and the two per-layer reduction points go through `Target.collectives`
(identity on one device). Each reduction point is joined to the norm after it:
`Collectives.add_rms_norm(part, r, ...)` sums the row-parallel output `part` over the ranks, adds
the residual r and normalises (one launch with TP's one-shot all-reduce). So the stream between
layers is (x, r) with the stream = x + (r summed over the ranks): r is down_proj's partial output.

The helpers at the top (config fields, RMSNorm, RoPE, the cache set-up) are shared with the
EAGLE-3 draft in draft.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dynspec.errors import DynspecError

from .attention import RaggedBatch, sdpa_attention, uniform_batch

_REQUIRED = object()


# ----------------------------------------------------------------------------- config helpers

def hf_field(cfg: dict, key: str, where: str, kind: type = int, default: Any = _REQUIRED, *,
             positive: bool = True) -> Any:
    """Read one field of an HF config dict; raise DynspecError naming `where` and `key`."""
    v = cfg.get(key)
    if v is None:
        if default is _REQUIRED:
            raise DynspecError(f"{where}: missing field '{key}'")
        return default
    if kind is bool:
        ok = isinstance(v, bool)
    elif kind is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    else:
        ok = isinstance(v, kind)
    if not ok:
        raise DynspecError(f"{where}: field '{key}' must be {kind.__name__}, got {v!r}")
    if positive and kind in (int, float) and v <= 0:
        raise DynspecError(f"{where}: field '{key}' must be positive, got {v!r}")
    return float(v) if kind is float else v


ROPE_TYPES = ("default", "linear", "llama3")


def attention_dims(cfg: dict, where: str) -> tuple[int, int, int, int]:
    """(hidden_size, heads, kv_heads, head_dim) of an HF config, checked for GQA and RoPE."""
    hidden = hf_field(cfg, "hidden_size", where)
    heads = hf_field(cfg, "num_attention_heads", where)
    kv_heads = hf_field(cfg, "num_key_value_heads", where, int, heads)
    if heads % kv_heads:
        raise DynspecError(f"{where}: field 'num_attention_heads' ({heads}) must be a multiple of "
                           f"'num_key_value_heads' ({kv_heads})")
    if cfg.get("head_dim") is None and hidden % heads:
        raise DynspecError(f"{where}: field 'hidden_size' ({hidden}) is not divisible by "
                           f"'num_attention_heads' ({heads}) and no 'head_dim' is given")
    head_dim = hf_field(cfg, "head_dim", where, int, hidden // heads)
    if head_dim % 2:
        raise DynspecError(f"{where}: field 'head_dim' ({head_dim}) must be even for RoPE")
    return hidden, heads, kv_heads, head_dim


def parse_rope(cfg: dict, where: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from an HF config; checks the scaling fields we use.

    Accepts the transformers<=4.x form (`rope_theta`, `rope_scaling`) and the newer
    `rope_parameters` dict. Returns rope_scaling None for plain RoPE.
    """
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "rope_scaling" not in cfg:
        theta = hf_field({**cfg, **params}, "rope_theta", where, float, 10000.0)
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = hf_field(cfg, "rope_theta", where, float, 10000.0)
        scaling = cfg.get("rope_scaling")
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise DynspecError(f"{where}: field 'rope_scaling' must be an object or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise DynspecError(f"{where}: field 'rope_scaling.rope_type' is {kind!r}; supported: {ROPE_TYPES}")
    if kind == "default":
        return theta, None
    need = ("factor",) if kind == "linear" else (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    out = {"rope_type": kind}
    for k in need:
        out[k] = hf_field(scaling, k, f"{where}: rope_scaling", float)
        if k == "original_max_position_embeddings":
            out[k] = int(out[k])
    if kind == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise DynspecError(f"{where}: field 'rope_scaling.high_freq_factor' must exceed low_freq_factor")
    return theta, out


def check_silu(cfg: dict, where: str) -> None:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise DynspecError(f"{where}: field 'hidden_act' is {act!r}; only 'silu' (SwiGLU) is supported")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise DynspecError(f"{where}: field '{key}' is true; biased projections are not supported")


# ----------------------------------------------------------------------------- math helpers

def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm computed in float32, as transformers' LlamaRMSNorm does."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> Tensor:
    """Inverse frequencies [head_dim // 2] in float32, with linear / llama3 scaling."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv / factor
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between
    # the two wavelength bounds is interpolated smoothly.
    old = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(head_dim: int, theta: float, scaling: dict | None, max_seq_len: int,
                device, dtype) -> tuple[Tensor, Tensor]:
    """cos, sin tables [max_seq_len, head_dim // 2], computed in float32, stored in `dtype`."""
    inv = rope_inv_freq(head_dim, theta, scaling).to(device)
    freqs = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE (HF/NeoX layout). x [..., hd]; cos, sin broadcast to [..., hd/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


DEFAULT_BLOCK_SIZE = 16


def setup_paged_cache(m: nn.Module, c, like: Tensor, layers: int | None, num_blocks: int, block_size: int,
                      max_seq_len: int) -> None:
    """Give `m` zeroed k_cache/v_cache pools [layers, kvh, num_blocks*block_size, hd] (no layer
    axis when layers is None) and RoPE tables for max_seq_len, on `like`'s device and dtype.
    Shared by the target and the draft; they use the same block tables."""
    shape = (c.num_kv_heads, num_blocks * block_size, c.head_dim)
    shape = shape if layers is None else (layers, *shape)
    m.k_cache = torch.zeros(shape, device=like.device, dtype=like.dtype)
    m.v_cache = torch.zeros(shape, device=like.device, dtype=like.dtype)
    m.rope_cos, m.rope_sin = rope_tables(c.head_dim, c.rope_theta, c.rope_scaling, max_seq_len,
                                         like.device, like.dtype)
    m.block_size, m.max_seq_len = block_size, max_seq_len


def setup_row_cache(m: nn.Module, c, like: Tensor, layers: int | None, max_batch: int, max_seq_len: int) -> None:
    """A pool in which row r owns blocks 1 + r*nb .. (r+1)*nb (block 0 is scratch), for the
    row-major `forward(tokens [B, T], positions [B, T], row0=...)` of tests and tools."""
    bs = DEFAULT_BLOCK_SIZE
    nb = -(-max_seq_len // bs)
    setup_paged_cache(m, c, like, layers, 1 + max_batch * nb, bs, max_seq_len)
    m.row_tables = 1 + torch.arange(max_batch * nb, device=like.device).view(max_batch, nb)   # [max_batch, nb]
    m.max_batch = max_batch


def row_batch(m: nn.Module, positions: Tensor, row0: int, kv_len: int | None) -> RaggedBatch:
    """The RaggedBatch of rows row0..row0+B-1 of a `setup_row_cache` pool; positions [B, T]."""
    if getattr(m, "row_tables", None) is None:
        raise RuntimeError(f"{type(m).__name__}.setup_cache(max_batch, max_seq_len) must be called before forward")
    B = positions.shape[0]
    nb = m.row_tables.shape[1]
    read = nb if kv_len is None else -(-kv_len // m.block_size)
    slots = torch.arange(row0, row0 + B, device=positions.device)
    return uniform_batch(m.row_tables, slots, positions, read, m.block_size)


def _empty(*shape: int, device=None, dtype=None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


def rope_write(qkv: Tensor, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor, write_index: Tensor,
               n_heads: int, n_kv_heads: int) -> Tensor:
    """qkv [N, (nh + 2 kvh) * hd] -> q [N, nh, hd] with RoPE; k (with RoPE) and v are written into
    the pools [kvh, P, hd] at write_index [N]. Compiled, it stores straight into the pool
    (inductor re-inplaces the index_put on the mutated input: no pool copy) in 3 kernels on the
    H200, where eager runs two RoPE kernels, two index copies and their transposes."""
    N, hd = qkv.shape[0], k_pool.shape[-1]
    q, k, v = qkv.view(N, n_heads + 2 * n_kv_heads, hd).split((n_heads, n_kv_heads, n_kv_heads), dim=1)
    k_pool[:, write_index] = apply_rope(k, cos, sin).transpose(0, 1)
    v_pool[:, write_index] = v.transpose(0, 1)
    return apply_rope(q, cos, sin)


def add_rms_norm(x: Tensor, r: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(x + r, rms_norm(x + r)): the residual add and the next norm in one pass."""
    y = x + r
    return y, rms_norm(y, weight, eps)


ARGMAX_CHUNKS = 128


def first_max(x: Tensor, chunks: int = ARGMAX_CHUNKS) -> tuple[Tensor, Tensor]:
    """(values, indices) of x [..., V] over its last axis, the index of the first maximum: what
    torch.max(x, -1) returns, in a form that fills the GPU when rows are few. torch reduces one
    row on one thread block (1 x 128256 bf16 logits: about a sixth of the lm_head GEMM before it
    on the H200), so with fewer rows than `chunks`
    each row is cut into `chunks` pieces of w = V // chunks, reduced side by side, then the
    pieces' maxima. Worked example, V = 10, chunks = 3, w = 3: pieces [0:3] [3:6] [6:9], tail [9];
    the first piece holding the overall max wins (ties go to the lower index, as in torch), and
    the tail only when strictly greater, its indices being the highest."""
    V = x.shape[-1]
    rows = x.numel() // V if V else 0
    w = V // chunks
    if rows >= chunks or w < 2:
        return x.max(dim=-1)
    lead = x.shape[:-1]
    x2 = x.reshape(rows, V)
    vals, idx = x2[:, :chunks * w].view(rows, chunks, w).max(dim=-1)        # [rows, chunks]
    best, c = vals.max(dim=-1)                                              # [rows]: first piece holding it
    index = c * w + idx.gather(-1, c[:, None]).squeeze(-1)
    if chunks * w < V:
        tv, ti = x2[:, chunks * w:].max(dim=-1)
        later = tv > best
        best, index = torch.where(later, tv, best), torch.where(later, ti + chunks * w, index)
    return best.view(lead), index.view(lead)


def silu_mul(gate_up: Tensor) -> Tensor:
    """[.., 2i] = [gate; up] -> silu(gate) * up [.., i]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Kernels:
    """The elementwise glue of a decoder layer, held per model (never process-wide).
    `Kernels()` is eager; `Kernels(compiled=True)` fuses each piece into one kernel with
    torch.compile: add_rms_norm (the previous layer's residual add joined to this norm),
    rope_write, add_rms_norm, silu_mul around a layer's 4 GEMMs and attention. At batch 1 the
    glue's launches and gaps, not its bytes, are what cost. On CUDA, compiled also swaps in
    hand-written Triton kernels where inductor's cost more: rope_kernel.rope_write_triton (one
    launch where inductor emits three) and norm_kernel's single-pass rms_norm / add_rms_norm
    (inductor's loops over a 4096-wide row twice)."""

    def __init__(self, compiled: bool = False):
        self.compiled = compiled
        c = (lambda fn: torch.compile(fn, dynamic=True, fullgraph=True)) if compiled else (lambda fn: fn)
        self.rms_norm, self.rope_write = c(rms_norm), c(rope_write)
        self.add_rms_norm, self.silu_mul = c(add_rms_norm), c(silu_mul)
        self.triton = compiled and torch.cuda.is_available()
        if self.triton:
            from .norm_kernel import add_rms_norm_triton, rms_norm_triton
            from .rope_kernel import rope_write_triton
            self.rope_write, self.rms_norm, self.add_rms_norm = rope_write_triton, rms_norm_triton, add_rms_norm_triton


# ----------------------------------------------------------------------------- the target

@dataclass(frozen=True)
class TargetConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def from_hf(cls, cfg: dict, where: str) -> "TargetConfig":
        """From a transformers LlamaConfig dict (config.json); `where` names the file."""
        if not isinstance(cfg, dict):
            raise DynspecError(f"{where}: expected a JSON object")
        mt = cfg.get("model_type", "llama")
        if mt != "llama":
            raise DynspecError(f"{where}: field 'model_type' is {mt!r}; only 'llama' targets are supported")
        check_silu(cfg, where)
        hidden, heads, kv_heads, head_dim = attention_dims(cfg, where)
        theta, scaling = parse_rope(cfg, where)
        return cls(
            vocab_size=hf_field(cfg, "vocab_size", where),
            hidden_size=hidden,
            intermediate_size=hf_field(cfg, "intermediate_size", where),
            num_layers=hf_field(cfg, "num_hidden_layers", where),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=hf_field(cfg, "rms_norm_eps", where, float, 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=hf_field(cfg, "tie_word_embeddings", where, bool, False),
            max_position_embeddings=hf_field(cfg, "max_position_embeddings", where, int, 2048),
        )


class Block(nn.Module):
    """One decoder layer: x + attn(norm(x)), then + mlp(norm(.)). Weights fused at load."""

    def __init__(self, c: TargetConfig, device=None, dtype=None):
        super().__init__()
        self.c = c                     # head counts are this instance's (a TP shard's) own
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.attention_norm = _empty(c.hidden_size, device=device, dtype=dtype)
        self.wqkv = _empty(self.q_size + 2 * self.kv_size, c.hidden_size, device=device, dtype=dtype)
        self.wo = _empty(c.hidden_size, self.q_size, device=device, dtype=dtype)
        self.ffn_norm = _empty(c.hidden_size, device=device, dtype=dtype)
        self.w13 = _empty(2 * c.intermediate_size, c.hidden_size, device=device, dtype=dtype)  # [gate; up]
        self.w2 = _empty(c.hidden_size, c.intermediate_size, device=device, dtype=dtype)

    @property
    def n_local_heads(self) -> int:
        return self.q_size // self.c.head_dim

    @property
    def n_local_kv_heads(self) -> int:
        return self.kv_size // self.c.head_dim

    def forward(self, x: Tensor, r: Tensor | None, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor,
                batch: RaggedBatch, f: Kernels, attention, comm: "Collectives") -> tuple[Tensor, Tensor]:
        """The residual stream entering this layer is x + r (x alone when r is None; r still to be
        summed over the ranks), x, r [N, h] packed tokens; cos, sin [N, 1, hd/2]; pools [kvh, P, hd]
        -> (x', r'): the stream after the layer is x' + r', left unsummed so that the next layer's
        norm does the all-reduce and the add in its kernel."""
        x, qkv = self.qkv(x, r, f, comm)
        rope_attend = getattr(attention, "rope_attend", None)          # ragged.RaggedAttention's fused path
        o = None if rope_attend is None else rope_attend(qkv, cos, sin, k_pool, v_pool, batch, self.n_local_heads)
        if o is None:
            q = f.rope_write(qkv, cos, sin, k_pool, v_pool, batch.write_index, self.n_local_heads,
                             self.n_local_kv_heads)
            o = attention(q, k_pool, v_pool, batch)
        return self.attn_out(x, o, f, comm)

    def qkv(self, x: Tensor, r: Tensor | None, f: Kernels, comm: "Collectives") -> tuple[Tensor, Tensor]:
        """(the stream x + r [N, h] (r summed over the ranks), qkv [N, (nh + 2 kvh) * hd] before RoPE)."""
        eps = self.c.rms_norm_eps
        if r is None:
            h = f.rms_norm(x, self.attention_norm, eps)
        else:
            x, h = comm.add_rms_norm(r, x, self.attention_norm, eps, f)
        return x, F.linear(h, self.wqkv)

    def attn_in(self, x: Tensor, r: Tensor | None, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor,
                write_index: Tensor, f: Kernels, comm: "Collectives") -> tuple[Tensor, Tensor]:
        """Up to attention: (the stream x + r [N, h], q [N, nh, hd]); this token's K/V written."""
        x, qkv = self.qkv(x, r, f, comm)
        return x, f.rope_write(qkv, cos, sin, k_pool, v_pool, write_index, self.n_local_heads, self.n_local_kv_heads)

    def attn_out(self, x: Tensor, o: Tensor, f: Kernels, comm: "Collectives") -> tuple[Tensor, Tensor]:
        """From attention's output o [N, nh*hd] on: (x', r') with the stream after the layer x' + r'
        (r' down_proj's output, still to be summed over the ranks)."""
        x, h = comm.add_rms_norm(F.linear(o, self.wo), x, self.ffn_norm, self.c.rms_norm_eps, f)
        return x, F.linear(f.silu_mul(F.linear(h, self.w13)), self.w2)


class Collectives:
    """The model's tensor-parallel reduction points; identity on one device. A TP engine
    swaps in one whose all_reduce sums row-parallel partial outputs over ranks and whose
    gather_vocab joins vocab-sharded logits."""

    def all_reduce(self, x: Tensor) -> Tensor:
        return x

    def add_rms_norm(self, part: Tensor, r: Tensor, weight: Tensor, eps: float, f: Kernels) -> tuple[Tensor, Tensor]:
        """(r + part summed over the ranks, rms_norm of it), part, r [N, h]: a row-parallel output
        joined to the residual and the norm after it."""
        return f.add_rms_norm(r, self.all_reduce(part), weight, eps)

    def settle(self, x: Tensor, r: Tensor | None) -> Tensor:
        """The stream x + r itself (r summed over the ranks), for the layers whose outputs are read."""
        return x if r is None else x + self.all_reduce(r)

    def gather_vocab(self, logits: Tensor) -> Tensor:
        return logits

    def argmax(self, logits: Tensor) -> Tensor:
        """Greedy ids [...] of the head's output [..., V] (a TP engine's: its vocab shard,
        reduced over ranks with 2N numbers per row instead of gathering the logits)."""
        return first_max(logits)[1]


class Target(nn.Module):
    """Llama-family target. Parameters are allocated uninitialised; load.py fills them."""

    def __init__(self, config: TargetConfig, *, device=None, dtype=None):
        super().__init__()
        c = self.config = config
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, _weight=torch.empty(
            c.vocab_size, c.hidden_size, device=device, dtype=dtype), _freeze=True)
        self.layers = nn.ModuleList(Block(c, device, dtype) for _ in range(c.num_layers))
        self.norm = _empty(c.hidden_size, device=device, dtype=dtype)
        self.output = None if c.tie_word_embeddings else _empty(
            c.vocab_size, c.hidden_size, device=device, dtype=dtype)
        self.kernels = Kernels()                                  # per model; the engine may swap in compiled ones
        self.collectives = Collectives()
        self.attention = sdpa_attention                           # (q, k_pool, v_pool, batch) -> [N, nh*hd]
        self.layer_hook = None                                    # run() calls it with i after layer i (graph captures)
        self.max_batch = self.max_seq_len = self.block_size = 0
        self.row_tables: Tensor | None = None
        self.register_buffer("k_cache", None, persistent=False)  # [L, kvh, blocks*block_size, hd]
        self.register_buffer("v_cache", None, persistent=False)
        self.register_buffer("rope_cos", None, persistent=False)  # [S, hd/2]
        self.register_buffer("rope_sin", None, persistent=False)

    @property
    def lm_head(self) -> Tensor:
        return self.tok_embeddings.weight if self.output is None else self.output

    def setup_cache(self, max_batch: int, max_seq_len: int) -> None:
        """Rows 0..max_batch-1 of max_seq_len positions each, for the row-major `forward`."""
        setup_row_cache(self, self.config, self.tok_embeddings.weight, self.config.num_layers, max_batch, max_seq_len)

    def setup_pool(self, num_blocks: int, block_size: int, max_seq_len: int) -> None:
        """A pool of num_blocks blocks; the engine hands out the block tables."""
        setup_paged_cache(self, self.config, self.tok_embeddings.weight, self.config.num_layers, num_blocks,
                          block_size, max_seq_len)

    def run(self, tokens: Tensor, batch: RaggedBatch, *, capture: tuple[int, ...] = (),
            logit_index: Tensor | None = None, attention=None,
            greedy: bool = False) -> tuple[Tensor, Tensor | None]:
        """tokens [N] packed -> (logits [M, V] at logit_index (all N when None),
        captured [N, len(capture)*h] or None). greedy: the argmax ids [M] instead of the logits.

        `capture` lists decoder layers (0-based) whose OUTPUTS (residual stream after the
        layer, before the final norm) are concatenated in the given order.
        """
        if self.k_cache is None:
            raise RuntimeError("Target.setup_cache or setup_pool must be called before forward")
        c = self.config
        for i in capture:
            if not 0 <= i < c.num_layers or capture.count(i) > 1:
                raise ValueError(f"capture {capture} must name distinct layers in 0..{c.num_layers - 1}")
        attention = attention or self.attention
        x, cos, sin = self.embed(tokens, batch.positions)
        caps: dict[int, Tensor] = {}
        f, comm = self.kernels, self.collectives
        r = None                                                          # stream = x + r summed over ranks
        for i, layer in enumerate(self.layers):
            x, r = layer(x, r, cos, sin, self.k_cache[i], self.v_cache[i], batch, f, attention, comm)
            if i in capture:
                x, r = comm.settle(x, r), None
                caps[i] = x
            if self.layer_hook is not None:
                self.layer_hook(i)                                        # engine._capture_chain's cut points
        hidden = torch.cat([caps[i] for i in capture], dim=-1) if capture else None  # [N, n*h]
        if logit_index is not None:                                       # every rank keeps the same rows
            x, r = x[logit_index], (None if r is None else r[logit_index])
        return self.head(self.final_norm(x, r), greedy), hidden

    def final_norm(self, x: Tensor, r: Tensor | None) -> Tensor:
        """The stream x + r (r summed over the ranks) [M, h] through the final norm."""
        eps = self.config.rms_norm_eps
        if r is None:
            return self.kernels.rms_norm(x, self.norm, eps)
        return self.collectives.add_rms_norm(r, x, self.norm, eps, self.kernels)[1]

    def embed(self, tokens: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """tokens, positions [N] -> (x [N, h], cos, sin [N, 1, hd/2])."""
        return (self.tok_embeddings(tokens), self.rope_cos[positions].unsqueeze(1),
                self.rope_sin[positions].unsqueeze(1))

    def head(self, h: Tensor, greedy: bool) -> Tensor:
        """The final-normed stream h [M, h] -> logits [M, V] (float32 on CPU), or greedy ids [M]."""
        out = F.linear(h, self.lm_head)                                   # [M, V | V_pad/N]
        if greedy:
            return self.collectives.argmax(out)
        out = self.collectives.gather_vocab(out)
        return out.float() if out.device.type == "cpu" else out

    def forward(self, tokens: Tensor, positions: Tensor, *, row0: int = 0, kv_len: int | None = None,
                capture: tuple[int, ...] = (), logits: str = "all") -> tuple[Tensor, Tensor | None]:
        """Row-major use (tests, tools) on a `setup_cache` pool: tokens, positions [B, T] in
        rows row0..row0+B-1 -> (logits [B, T or 1, V], captured [B, T, len(capture)*h] or None).
        Only positions < kv_len are read (default: max_seq_len)."""
        if logits not in ("all", "last"):
            raise ValueError(f"logits must be 'all' or 'last', not {logits!r}")
        B, T = tokens.shape
        batch = row_batch(self, positions, row0, kv_len)
        last = torch.arange(T - 1, B * T, T, device=tokens.device) if logits == "last" else None
        out, hidden = self.run(tokens.reshape(B * T), batch, capture=capture, logit_index=last)
        return out.view(B, -1, out.shape[-1]), (None if hidden is None else hidden.view(B, T, -1))
