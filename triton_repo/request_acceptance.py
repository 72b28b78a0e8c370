"""A finished request's drafting as the Triton model reports it: its output tensors and the
buckets of its Prometheus histograms (model_metrics.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynspec.runtime.policy import draft_counts

# Output tensors of a finished request (config.pbtxt's outputs after output_ids), each of shape [1]:
#   accepted_drafts INT32  draft tokens of the request the target accepted
#   drafted         INT32  draft tokens verified for it (sum of its per-iteration K_i)
#   decode_steps    INT32  iterations it ran as a decode row
#   mean_k          FP32   drafted / decode_steps (0 before its first decode iteration)
# Example: K=4 for 3 iterations, 5 drafts accepted -> (5, 12, 3, 4.0); acceptance 5 / 12.
ACCEPTANCE_OUTPUTS = ("accepted_drafts", "drafted", "decode_steps", "mean_k")
ACCEPTANCE_BUCKETS = tuple(round(i / 10, 1) for i in range(11))    # (0.0, 0.1, ..., 1.0): le bounds


@dataclass(frozen=True)
class RequestAcceptance:
    """One finished request's drafting, as the executor counted it (RequestResult)."""
    accepted_drafts: int
    drafted: int
    decode_steps: int

    @classmethod
    def of(cls, result) -> "RequestAcceptance":
        return cls(int(result.accepted_drafts), int(result.drafted), int(result.decode_steps))

    @property
    def mean_k(self) -> float:
        return draft_counts.mean_k(self.drafted, self.decode_steps)

    @property
    def acceptance(self) -> float | None:
        """None for a request that never drafted (not observed in the histogram)."""
        return draft_counts.acceptance(self.accepted_drafts, self.drafted)

    def outputs(self) -> dict[str, np.ndarray]:
        """ACCEPTANCE_OUTPUTS -> [1] arrays: {"accepted_drafts": int32[1], ..., "mean_k": float32[1]}."""
        return {"accepted_drafts": np.array([self.accepted_drafts], dtype=np.int32),
                "drafted": np.array([self.drafted], dtype=np.int32),
                "decode_steps": np.array([self.decode_steps], dtype=np.int32),
                "mean_k": np.array([self.mean_k], dtype=np.float32)}


def mean_k_buckets(max_draft_len: int) -> tuple[float, ...]:
    """le bounds of the per-request mean K histogram, in steps of 0.5: 4 -> (0.0, 0.5, ..., 4.0)."""
    return tuple(i / 2 for i in range(2 * max(0, int(max_draft_len)) + 1))

