"""Is tensor parallelism at `tp` feasible for a model shape? Every message names the number at
fault, e.g. "num_attention_heads=12 is not divisible by tp=8 (12 % 8 = 4)".
"""
from __future__ import annotations

from dataclasses import dataclass

from dynspec.checkpoint.shapes import ModelShape, kv_replication, padded_vocab
from dynspec.errors import DynspecError


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class TpReport:
    tp: int
    checks: tuple[Check, ...]
    kv_replication: int      # ranks holding each KV head (1 = no replication)
    vocab_padded: int        # vocabulary rows after padding to a multiple of tp

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def passed(self) -> list[dict]:
        return [{"name": c.name, "detail": c.detail} for c in self.checks if c.ok]


def _divisible(name: str, value: int, tp: int) -> Check:
    if value % tp == 0:
        return Check(name, True, f"{name}={value} splits {value // tp} per rank at tp={tp}")
    return Check(name, False, f"{name}={value} is not divisible by tp={tp} ({value} % {tp} = {value % tp})")


def _kv_heads(kv: int, tp: int) -> Check:
    name = "num_key_value_heads"
    if kv >= tp:
        return _divisible(name, kv, tp)
    if tp % kv == 0:
        return Check(name, True, f"{name}={kv} < tp={tp}: each KV head is replicated on {tp // kv} ranks")
    return Check(name, False, f"{name}={kv} < tp={tp} and tp is not a multiple of it ({tp} % {kv} = {tp % kv}),"
                              " so KV heads cannot be replicated evenly")


def _vocab(vocab: int, tp: int, name: str) -> Check:
    pad = padded_vocab(vocab, tp)
    if pad == vocab:
        return Check(name, True, f"{name}={vocab} splits {vocab // tp} rows per rank at tp={tp}")
    return Check(name, True, f"{name}={vocab} is padded to {pad} (+{pad - vocab} rows) for tp={tp}")


def tp_report(shape: ModelShape, tp: int, vocab_field: str = "vocab_size") -> TpReport:
    """All TP checks for `shape`; failures are kept, not raised (see require_tp).
    vocab_field names the config field behind shape.vocab (an EAGLE-3 head: draft_vocab_size)."""
    if tp < 1:
        raise DynspecError(f"tp={tp} must be at least 1")
    checks = (
        _divisible("num_attention_heads", shape.heads, tp),
        _kv_heads(shape.kv_heads, tp),
        _divisible("intermediate_size", shape.intermediate, tp),
        _vocab(shape.vocab, tp, vocab_field),
    )
    return TpReport(tp, checks, kv_replication(shape.kv_heads, tp), padded_vocab(shape.vocab, tp))


def require_tp(shape: ModelShape, tp: int, where: str, vocab_field: str = "vocab_size") -> TpReport:
    """tp_report, raising one DynspecError that lists every failed check."""
    report = tp_report(shape, tp, vocab_field)
    if report.failures:
        raise DynspecError(f"TP={tp} is infeasible for {where}: " + "; ".join(c.detail for c in report.failures))
    return report
