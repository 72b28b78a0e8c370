"""The keys of the pure-decode graphs: which (kind, bucket, K) shapes a schedule can reach, and
the one order every rank captures them in."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from dynspec.runtime.serving.plan import batch_buckets, bucket_for, cap_k, sync_mode
from dynspec.runtime.policy import speculates


class Route(Enum):
    """The one path of a step (ReferenceEngine.route), chosen from its plan and the GraphMode."""
    DECODE_GRAPH = "decode graph"              # the (bucket, K) graph chains (capture.capture_decode_graphs)
    DECODE_EAGER = "decode eager"              # their device functions (draft_chain.device_fn)
    WHOLE_GRAPH = "whole-forward graph"        # mixed_graphs.WholeMixed (CPU: its function, uncaptured)
    WHOLE_EAGER = "whole-forward eager"        # eager_mixed.eager_mixed


@dataclass(frozen=True)
class GraphKey:
    kind: str                # "spec" | "decode" | "refresh"
    bucket: int              # padded row count
    k: int = 0               # drafted tokens per row; > 0 only for "spec"
    sync: str = "off"        # "decode" only, the draft sync (plan.StepPlan.sync): "warm" the draft
                             # extends its KV over the new token, "lazy" the features are stored, "off"
    draft: bool = True       # "decode" only, False: a policy that never drafts (its mixed iterations
                             # run the target alone; its decode steps share the sync="off" graph)

    @property
    def keep_warm(self) -> bool:
        return self.sync == "warm"


def reachable_graphs(policies: Iterable, max_batch_size: int, draft_sync: str | bool,
                     max_num_tokens: int | None = None) -> tuple[GraphKey, ...]:
    """Every graph some batch size 1..max_batch_size can reach under any of the policies,
    with K capped to the token budget as the executor caps it (plan.cap_k).

    Example: threshold K=4 up to b=5, max batch 8, buckets (1, 2, 4, 8):
        spec (1,4) (2,4) (4,4) (8,4)   [b=5 pads to 8]   decode (8, sync)   refresh (1) (2) (4) (8)
    draft_sync: "lazy", "warm" or "off" (sync_mode; a bool: warm or off). An AdaptivePolicy may
    pick any of its candidates at any batch size: every bucket gets each, and under "warm" its K=0
    steps run with or without keep-warm (runtime/policy/adaptive.py, step 4): both decode graphs.
    A policy that never drafts (policy.speculates) gets decode keys without draft sync or draft.
    """
    sync = sync_mode(draft_sync)
    buckets = batch_buckets(max_batch_size)
    keys: set[GraphKey] = set()
    for policy in policies:
        if not speculates(policy):
            keys.update(GraphKey("decode", bucket, draft=False) for bucket in buckets)
            continue
        for b in range(1, max_batch_size + 1):
            bucket = bucket_for(b, buckets)
            ks = policy.choices(b)                          # AdaptivePolicy: every candidate at every b
            for k in {k if max_num_tokens is None else cap_k(k, b, max_num_tokens) for k in ks}:
                if k > 0:
                    keys.add(GraphKey("spec", bucket, k))
                    keys.add(GraphKey("refresh", bucket))      # first spec step after a K=0 stretch
                else:
                    keys.add(GraphKey("decode", bucket, sync=sync))
                    if sync == "warm" and policy.chooses_keep_warm:
                        keys.add(GraphKey("decode", bucket, sync="off"))
    return capture_order(keys)


def capture_order(keys: Iterable[GraphKey]) -> tuple[GraphKey, ...]:
    """The keys once each, in one total order (kind, bucket, k, sync, draft). Under TP every rank
    warms up and captures in this order, so their collectives pair up: a set ordered by (kind,
    bucket, k) alone leaves decode (4, warm) and decode (4) in hash order, which differs per
    process, and the ranks would run different collectives until NCCL's watchdog fires."""
    return tuple(sorted(set(keys), key=lambda g: (g.kind, g.bucket, g.k, g.sync, g.draft)))
