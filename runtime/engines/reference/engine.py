"""The reference engine: batched EAGLE-3 chain drafting + greedy verification, in PyTorch.

Token/hidden bookkeeping for one row (x_j = token at position j, h_j = target capture at j):
    target cache   positions 0..L-1 hold x_0..x_{L-1};  x_L (pending) is not in it yet
    draft entry j  = (x_j, h_{j-1}) -> predicts x_{j+1}; stored at draft cache position j-1
    carried state  next_draft[r]   = draft's guess for x_{L+1} (from entry L)
                   draft_hidden[r] = that entry's output hidden (fed to the next chain step)
                   last_capture[r] = h_{L-1} (to rebuild entry L when the draft went stale)

Speculative step, K drafts, worked for K=2, accepted n=1:
    chain      entry L   -> d1 = next_draft     entry L+1 = (d1, draft_hidden) -> d2   [B, 1] each
    verify     target([x_L, d1, d2] @ L..L+2)  -> g0 g1 g2, H_L..H_{L+2}        [B, K+1]
    accept     d1 == g0, d2 != g1  -> n = 1;  emitted = [d1, g1]  (E[:, :n+1])
    catch-up   draft entries L+1..L+3 = (E_i, H_{L+i}) @ draft positions L..L+2   [B, K+1]
               entries up to L+n+1 are right; the one at index n is the next step's entry L'
               -> new next_draft, draft_hidden, last_capture = H_{L+n}.  Later entries are
               overwritten before they are read.
Plain decode (K=0): target([x_L]) -> g0. Keep-warm writes the draft K/V of entry L+1 only;
the first speculative step after a K=0 stretch rebuilds the draft head from (x_L, last_capture) first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from dynspec.runtime.acceptance import AcceptanceModel, Bernoulli, accepted_prefix
from dynspec.runtime.plan import StepPlan, StepResult, batch_buckets, bucket_for


@dataclass(frozen=True)
class GraphKey:
    kind: str                # "spec" | "decode" | "refresh"
    bucket: int              # padded row count
    k: int = 0               # drafted tokens per row; > 0 only for "spec"
    keep_warm: bool = False  # "decode" only: the draft extends its KV over the new token


def reachable_graphs(policies: Iterable, max_batch_size: int, keep_warm: bool) -> tuple[GraphKey, ...]:
    """Every graph some batch size 1..max_batch_size can reach under any of the policies.

    Example: threshold K=4 up to b=5, max batch 8, buckets (1, 2, 4, 8):
        spec (1,4) (2,4) (4,4) (8,4)   [b=5 pads to 8]   decode (8, keep_warm)   refresh (1) (2) (4) (8)
    """
    buckets = batch_buckets(max_batch_size)
    keys: set[GraphKey] = set()
    for policy in policies:
        for b in range(1, max_batch_size + 1):
            bucket, k = bucket_for(b, buckets), int(policy(b))
            if k > 0:
                keys.add(GraphKey("spec", bucket, k))
                keys.add(GraphKey("refresh", bucket))      # first spec step after a K=0 stretch
            else:
                keys.add(GraphKey("decode", bucket, keep_warm=keep_warm))
    return tuple(sorted(keys, key=lambda g: (g.kind, g.bucket, g.k, g.keep_warm)))


class ReferenceEngine:
    def __init__(self, target, draft, *, max_batch_size: int, max_seq_len: int, max_draft_len: int):
        self.target, self.draft = target, draft
        self.max_batch_size, self.max_seq_len, self.max_draft_len = max_batch_size, max_seq_len, max_draft_len
        # CPU: every batch size is its own shape (no padding work); CUDA: padded graph buckets
        on_cuda = next(target.parameters()).device.type == "cuda"
        self.buckets = batch_buckets(max_batch_size) if on_cuda else tuple(range(1, max_batch_size + 1))
        self.capture = tuple(draft.capture_layers)
        self.vocab_size = target.config.vocab_size
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        n, dev = max_batch_size, p.device
        target.setup_cache(n, max_seq_len)
        draft.setup_cache(n, max_seq_len)
        fused = len(self.capture) * target.config.hidden_size
        # carried per-row state (see module docstring)
        self.next_draft = torch.zeros(n, dtype=torch.long, device=dev)                             # [N]
        self.draft_hidden = torch.zeros(n, draft.config.hidden_size, dtype=p.dtype, device=dev)   # [N, h_draft]
        self.last_capture = torch.zeros(n, fused, dtype=p.dtype, device=dev)   # [N, n_capture*h_target]
        # static step inputs / outputs (also the CUDA-graph I/O)
        self.x = torch.zeros(n, dtype=torch.long, device=dev)                  # [N] pending tokens
        self.pos = torch.ones(n, dtype=torch.long, device=dev)                 # [N] their positions
        self.out_tokens = torch.zeros(n, max_draft_len + 1, dtype=torch.long, device=dev)  # [N, K+1]
        self.out_n = torch.zeros(n, dtype=torch.long, device=dev)              # [N]
        self.p_accept = torch.zeros((), dtype=torch.float32, device=dev)       # Bernoulli p
        self.bernoulli = torch.zeros((), dtype=torch.bool, device=dev)         # use it? (benchmarks)
        self.rng = torch.Generator(device=dev)        # this engine's Bernoulli draws; the global RNG is untouched
        self._acceptance: AcceptanceModel | None = None   # what p_accept/bernoulli hold (host copy: no sync)
        self._graphs: dict[GraphKey, "torch.cuda.CUDAGraph"] = {}
        self.eager_fallbacks = 0

    # ---- prefill: new requests into rows row0.. (batched, left-padded) ---------------------
    @torch.inference_mode()
    def prefill(self, row0: int, prompts: Sequence[Sequence[int]], max_tokens: int = 8192) -> list[int]:
        """Fill rows row0..row0+n-1 with the prompts; return each one's first generated token.
        Chunks of at most `max_tokens` padded tokens run as one batched forward."""
        firsts: list[int] = []
        i = 0
        while i < len(prompts):
            L, n = len(prompts[i]), 0
            while i + n < len(prompts) and max(L, len(prompts[i + n])) * (n + 1) <= max(max_tokens, L):
                L, n = max(L, len(prompts[i + n])), n + 1
            firsts += self._prefill_chunk(row0 + i, prompts[i: i + n], L)
            i += n
        return firsts

    def _prefill_chunk(self, row0: int, prompts: Sequence[Sequence[int]], L: int) -> list[int]:
        """Left padding keeps every row's last prompt token in the last column. Pad columns
        take the positions just past the prompt, so causal-by-position attention never lets a
        real token see them, and their cache writes land where decoding overwrites them first.
            prompt [a b c], L=5:  tokens [0 0 a b c]   positions [3 4 0 1 2]"""
        n, dev = len(prompts), self.device
        toks = torch.zeros(n, L, dtype=torch.long)
        pos = torch.zeros(n, L, dtype=torch.long)
        for r, p in enumerate(prompts):
            P = len(p)
            toks[r, L - P:] = torch.tensor(list(p), dtype=torch.long)
            pos[r] = torch.cat([torch.arange(P, L), torch.arange(P)])
        toks, pos = toks.to(dev), pos.to(dev)                                          # [n, L]
        logits, H = self.target(toks, pos, row0=row0, kv_len=L, capture=self.capture, logits="last")
        g0 = logits[:, -1].argmax(dim=-1)                                              # [n]
        # draft entries 1..P: tokens x_1..x_{P-1}, g0 with h_0..h_{P-1}, at draft positions 0..P-1
        dtoks = torch.cat([toks[:, 1:], g0[:, None]], dim=1)                           # [n, L]
        dl, dh = self.draft(dtoks, H, pos, row0=row0, kv_len=L)
        rows = slice(row0, row0 + n)
        self.next_draft[rows] = self.draft.to_target_ids(dl[:, -1].argmax(dim=-1))
        self.draft_hidden[rows] = dh[:, -1]
        self.last_capture[rows] = H[:, -1]
        return g0.tolist()

    def move_row(self, src: int, dst: int) -> None:
        self.target.copy_row(src, dst)
        self.draft.copy_row(src, dst)
        for buf in (self.next_draft, self.draft_hidden, self.last_capture):
            buf[dst] = buf[src]

    # ---- one iteration --------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, plan: StepPlan, acceptance: AcceptanceModel) -> StepResult:
        b, B, K = plan.batch_size, plan.bucket, plan.k
        self.x[:b] = torch.tensor(plan.pending, dtype=torch.long)
        self.pos[:b] = torch.tensor(plan.positions, dtype=torch.long)
        self.x[b:B] = 0
        self.pos[b:B] = 1                          # padding rows: free cache rows, harmless writes
        self._set_acceptance(acceptance)
        kv_len = None if self._graphs else plan.max_position + 1
        if K == 0:
            self._run(GraphKey("decode", B, int(plan.keep_warm)), kv_len)
            warm = False                           # the draft head is rebuilt on resume
        else:
            if any(plan.stale):
                self._run(GraphKey("refresh", B, 0), kv_len)
            self._run(GraphKey("spec", B, K), kv_len)
            warm = True
        host = torch.cat([self.out_n[:b, None], self.out_tokens[:b, : K + 1]], dim=1).tolist()  # the one host sync
        n = [row[0] for row in host]
        toks = [row[1:] for row in host]
        return StepResult(
            accepted=tuple(n),
            emitted=tuple(tuple(t[: a + 1]) for t, a in zip(toks, n)),
            draft_warm=warm,
        )

    def _set_acceptance(self, acceptance: AcceptanceModel) -> None:
        """Device flags follow the host copy; the generator is reseeded when the model changes."""
        if acceptance == self._acceptance:
            return
        bern = isinstance(acceptance, Bernoulli)
        if bern:
            self.rng.manual_seed(acceptance.seed)
        self.bernoulli.fill_(bern)
        self.p_accept.fill_(acceptance.p if bern else 0.0)
        self._acceptance = acceptance

    def _run(self, key: GraphKey, kv_len: int | None) -> None:
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        if self._graphs:
            self.eager_fallbacks += 1     # a shape the schedule was not expected to reach
        self._device_fn(key, None if self._graphs else kv_len)

    def _device_fn(self, key: GraphKey, kv_len: int | None) -> None:
        B = key.bucket
        if key.kind == "spec":
            self._speculate(B, key.k, kv_len)
        elif key.kind == "decode":
            self._decode(B, key.keep_warm, kv_len)
        else:
            self._refresh(B, kv_len)

    # ---- device functions: static buffers in, static buffers out; graph-capturable ----------
    def _draft_next(self, tokens, hidden, positions, kv_len):
        """Draft forward -> (target-vocab argmax [B, T], output hidden [B, T, h])."""
        dl, dh = self.draft(tokens, hidden, positions, kv_len=kv_len)
        return self.draft.to_target_ids(dl.argmax(dim=-1)), dh

    def _refresh(self, B: int, kv_len) -> None:
        """Rebuild entry L of stale rows: (x_L, h_{L-1}) at draft position L-1."""
        x, pos = self.x[:B, None], self.pos[:B, None]                        # [B, 1]
        d, h = self._draft_next(x, self.last_capture[:B, None], pos - 1, kv_len)
        self.next_draft[:B], self.draft_hidden[:B] = d[:, 0], h[:, 0]

    def _speculate(self, B: int, K: int, kv_len) -> None:
        x, pos = self.x[:B], self.pos[:B]                                    # [B]
        drafts, h = [self.next_draft[:B]], self.draft_hidden[:B]
        for i in range(1, K):                                                # entries L+1..L+K-1
            d, hh = self._draft_next(drafts[-1][:, None], h[:, None], (pos + i - 1)[:, None], kv_len)
            drafts.append(d[:, 0])
            h = hh[:, 0]
        D = torch.stack(drafts, dim=1)                                       # [B, K]
        steps = torch.arange(K + 1, device=x.device)                         # [K+1]
        vpos = pos[:, None] + steps                                          # [B, K+1]
        logits, H = self.target(torch.cat([x[:, None], D], 1), vpos, kv_len=kv_len, capture=self.capture)
        g = logits.argmax(dim=-1)                                            # [B, K+1]
        match = torch.where(self.bernoulli, torch.rand(B, K, device=x.device, generator=self.rng) < self.p_accept, D == g[:, :K])
        n = accepted_prefix(match)                                           # [B]
        # E[:, i] = d_{i+1} for i < n, else the target's token: emitted = E[:, :n+1]
        E = torch.where(steps[None] < n[:, None], torch.cat([D, g[:, -1:]], 1), g)   # [B, K+1]
        self._catch_up(E, H, vpos, n, kv_len)
        self.out_tokens[:B, : K + 1] = E
        self.out_n[:B] = n

    def _decode(self, B: int, keep_warm: bool, kv_len) -> None:
        """Plain decode. Keep-warm writes only the draft's K/V for the new entry (no draft
        attention, MLP or lm_head); the draft head (next_draft, draft_hidden) is rebuilt by `_refresh` when
        speculation resumes, so every later draft step sees a complete cache."""
        x, pos = self.x[:B, None], self.pos[:B, None]                        # [B, 1]
        logits, H = self.target(x, pos, kv_len=kv_len, capture=self.capture)
        g = logits.argmax(dim=-1)                                            # [B, 1]
        if keep_warm:
            self.draft.extend_kv(g, H, pos)                                  # entry L+1 @ draft pos L
        self.last_capture[:B] = H[:, 0]
        self.out_tokens[:B, :1] = g
        self.out_n[:B] = 0

    def _catch_up(self, E, H, vpos, n, kv_len) -> None:
        """Draft entries L+1..L+T from (E_i, H_i) at draft positions L..L+T-1; keep index n."""
        d, h = self._draft_next(E, H, vpos, kv_len)                          # [B, T], [B, T, h]
        rows = torch.arange(E.shape[0], device=E.device)
        B = E.shape[0]
        self.next_draft[:B] = d[rows, n]
        self.draft_hidden[:B] = h[rows, n]
        self.last_capture[:B] = H[rows, n]

    # ---- CUDA graphs ------------------------------------------------------------------------
    def capture_graphs(self, keys: Iterable[GraphKey]) -> int:
        """Capture one graph per key (call once at start, on CUDA). Returns how many."""
        if self.device.type != "cuda":
            return 0
        keys = list(keys)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        self.x.zero_()
        self.pos.fill_(1)
        with torch.inference_mode():
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for key in keys:                       # warm up every shape once (allocator, kernels)
                    self._device_fn(key, None)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for key in keys:
                g = torch.cuda.CUDAGraph()
                if key.kind == "spec":
                    g.register_generator_state(self.rng)   # Bernoulli draws advance on replay
                with torch.cuda.graph(g, pool=pool):
                    self._device_fn(key, None)
                self._graphs[key] = g
        torch.cuda.synchronize()
        return len(keys)


def load_reference_engine(
    target_dir: str,
    draft_dir: str,
    *,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    max_batch_size: int = 64,
    max_seq_len: int = 1024,
    max_draft_len: int = 8,
    fused_kernels: bool | None = None,
) -> ReferenceEngine:
    """fused_kernels: torch.compile the per-layer elementwise glue (default: on CUDA only)."""
    from dynspec.runtime.engines.reference.load import load_draft, load_target
    from dynspec.runtime.engines.reference.model import Kernels

    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    target = load_target(target_dir, device=device, dtype=dt)
    if fused_kernels if fused_kernels is not None else str(device).startswith("cuda"):
        target.kernels = Kernels(compiled=True)          # this engine only
    draft = load_draft(draft_dir, target, device=device, dtype=dt)
    return ReferenceEngine(target, draft, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                           max_draft_len=max_draft_len)
