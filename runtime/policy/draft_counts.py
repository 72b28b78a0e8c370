"""A request's drafting in two numbers, one definition for results, served responses, the HTTP
front and sweep records (no imports: the front reads it too)."""
from __future__ import annotations


def mean_k(drafted: int, decode_steps: int) -> float:
    """A request's mean draft length per decode iteration: 12 drafted over 3 -> 4.0 (0.0 before any)."""
    return drafted / decode_steps if decode_steps else 0.0


def acceptance(accepted_drafts: int, drafted: int) -> float | None:
    """Accepted / drafted: 5 of 12 -> 0.4167; None for a request that never drafted."""
    return accepted_drafts / drafted if drafted else None
