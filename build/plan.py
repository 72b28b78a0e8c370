"""Per-rank GPU memory plan for one engine dir: weights, draft, CUDA-graph pool, KV capacity.

TRT-LLM sizes the KV cache from the memory that is free after the model is loaded and warmed
up: kv_budget = free * kv_cache_config.free_gpu_memory_fraction. So, per rank:
    free       = gpu - target weights - draft weights - graph pool - runtime reserve
    kv_budget  = floor(free * fraction)
    KV blocks  = kv_budget // (tokens_per_block * (target + draft KV bytes per token))
    tokens     = blocks * tokens_per_block;  requests = tokens // max_seq_len
The graph pool is an estimate: graphs share one pool, sized by the largest captured decode
batch's live activations per token (hidden/residual/norm out, q|k|v, gate|up, fp32 logits).
TRT-LLM's cuda_graph_config doc bounds it at "up to 200 MB" per graph.
"""
from __future__ import annotations

from dataclasses import dataclass

from dynspec.checkpoint.shapes import ModelShape, dtype_bytes, kv_heads_per_rank, padded_vocab
from dynspec.errors import DynspecError

GB = 10**9
GIB = 2**30
RUNTIME_RESERVE_BYTES = 2 * GIB      # CUDA context, NCCL and cuBLAS workspaces (estimate)
TOKENS_PER_BLOCK = 32                # kv_cache_config.tokens_per_block default in TRT-LLM 1.2


@dataclass(frozen=True)
class MemoryPlan:
    gpu_bytes: int
    target_weight_bytes: int
    draft_weight_bytes: int
    graph_pool_bytes: int
    reserve_bytes: int
    kv_fraction: float
    kv_budget_bytes: int
    kv_bytes_per_token: int       # target + draft, per rank
    kv_tokens: int
    max_seq_len: int
    max_batch_size: int

    @property
    def concurrent_requests(self) -> int:
        return self.kv_tokens // self.max_seq_len


def activation_bytes_per_token(s: ModelShape, tp: int, dtype: str) -> int:
    """Live decode activations of one token on one rank, inside a captured graph.
    70B shape, tp 8, bf16: 2*(3*8192 + (8 + 2*1)*128 + 2*3584) + 4*16032 = 130,176 bytes."""
    qkv = (s.heads // tp + 2 * kv_heads_per_rank(s.kv_heads, tp)) * s.head_dim
    per_token = dtype_bytes(dtype) * (3 * s.hidden + qkv + 2 * (s.intermediate // tp))
    return per_token + 4 * (padded_vocab(s.vocab, tp) // tp)


def memory_plan(*, target: ModelShape, tp: int, dtype: str, target_weight_bytes: int, draft_weight_bytes: int,
                kv_bytes_per_token: int, graph_tokens: int, gpu_bytes: int, kv_fraction: float,
                max_seq_len: int, max_batch_size: int) -> MemoryPlan:
    if not 0 < kv_fraction <= 1:
        raise DynspecError(f"--kv-cache-fraction {kv_fraction} must be in (0, 1]")
    pool = graph_tokens * activation_bytes_per_token(target, tp, dtype)
    free = gpu_bytes - target_weight_bytes - draft_weight_bytes - pool - RUNTIME_RESERVE_BYTES
    if free <= 0:
        raise DynspecError(
            f"weights ({(target_weight_bytes + draft_weight_bytes) / GIB:.1f} GiB per rank) plus graph pool and "
            f"reserve do not fit a {gpu_bytes / GB:g} GB GPU at tp={tp}"
        )
    budget = int(free * kv_fraction)
    blocks = budget // (TOKENS_PER_BLOCK * kv_bytes_per_token)
    return MemoryPlan(gpu_bytes, target_weight_bytes, draft_weight_bytes, pool, RUNTIME_RESERVE_BYTES,
                      kv_fraction, budget, kv_bytes_per_token, blocks * TOKENS_PER_BLOCK, max_seq_len, max_batch_size)


def format_plan(p: MemoryPlan, tp: int) -> str:
    rows = [
        ("target weights", p.target_weight_bytes),
        ("draft weights", p.draft_weight_bytes),
        ("CUDA-graph pool (est.)", p.graph_pool_bytes),
        ("runtime reserve (est.)", p.reserve_bytes),
        (f"KV cache ({p.kv_fraction:.0%} of free)", p.kv_budget_bytes),
    ]
    lines = [f"per-rank memory plan: tp={tp} on a {p.gpu_bytes / GB:g} GB GPU", f"{'':26}{'GiB':>9}  {'bytes':>15}"]
    lines += [f"{name:26}{b / GIB:9.2f}  {b:15,d}" for name, b in rows]
    lines.append(f"{'KV bytes per token':26}{'':9}  {p.kv_bytes_per_token:15,d}  (target + draft)")
    lines.append(f"{'KV capacity':26}{'':9}  {p.kv_tokens:15,d}  tokens")
    note = f"  (max_batch_size {p.max_batch_size})" if p.concurrent_requests > p.max_batch_size else ""
    lines.append(f"{'concurrent requests':26}{'':9}  {p.concurrent_requests:15,d}  at max_seq_len {p.max_seq_len}{note}")
    return "\n".join(lines)
