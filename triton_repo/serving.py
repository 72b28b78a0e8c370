"""Triton-free logic of the reference `dynspec` model that is neither request parsing
(request_parsing.py) nor metrics (model_metrics.py): the target's model info (vocab size, end ids,
tokenizer, prompt bound), the policy line logged at load, and streamed detokenization. The
python-backend model.py is a thin shell around these modules."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from dynspec.errors import DynspecError
from dynspec.triton_repo.request_acceptance import RequestAcceptance  # noqa: F401 - model.py reads it here
from dynspec.triton_repo.words import OutputWatch  # noqa: F401 - model.py calls serving.OutputWatch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class ModelInfo:
    vocab_size: int
    eos_ids: tuple[int, ...]
    tokenizer: object | None = field(default=None, compare=False)
    max_prompt_bytes: int | None = None     # a text_input longer than this is refused before tokenizing

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def encode_words(self, text: str) -> list[int]:
        """Token ids of `text` without special tokens (no BOS): how stop and bad words are matched."""
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        except TypeError:                   # a tokenizer without the HF keyword
            return list(self.tokenizer.encode(text))


def _eos(value, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DynspecError(f"{where}: field 'eos_token_id' must be an int or a list of ints, not {value!r}")
    return tuple(ids)


def longest_token_bytes(tokenizer) -> int:
    """The UTF-8 length of the longest token string in the vocabulary: no token stands for more
    bytes of text than that (a byte-level token's string has one character per byte, a
    SentencePiece piece spells '▁' for one space and '<0xFF>' for one byte), so a text of more
    than max_seq_len x this many bytes has more than max_seq_len tokens."""
    return max((len(t.encode("utf-8")) for t in tokenizer.get_vocab()), default=1)


def policy_line(cfg, policy) -> str:
    """What decides K in the served model (engine.json's schedule and policy), for the one log line
    at model load:
        'schedule 4:4 (K=4 for b<=4, K=0 above); policy: schedule'
        'schedule 4:4 (K=4 for b<=4, K=0 above) bounds K; policy: adaptive (cost model E/cost_model.json, K 0..4)'"""
    from dynspec.runtime.serving.driver import describe_policy, describe_schedule

    kind = describe_policy(policy, cfg.cost_model)
    return f"schedule {describe_schedule(cfg.schedule)}{' bounds K' if kind != 'schedule' else ''}; policy: {kind}"


def with_prompt_bound(info: ModelInfo, max_seq_len: int) -> ModelInfo:
    """info, refusing text_input of more than max_seq_len x longest_token_bytes bytes untokenized."""
    if info.tokenizer is None or not hasattr(info.tokenizer, "get_vocab"):
        return info
    from dataclasses import replace

    return replace(info, max_prompt_bytes=max_seq_len * longest_token_bytes(info.tokenizer))


def load_model_info(target_dir: str | Path, with_tokenizer: bool = True) -> ModelInfo:
    """vocab size, end ids (generation_config.json wins over config.json) and the HF tokenizer if any."""
    target_dir = Path(target_dir)
    path = target_dir / "config.json"
    if not path.is_file():
        raise DynspecError(f"target config {path} does not exist")
    cfg = json.loads(path.read_text())
    vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise DynspecError(f"{path}: field 'vocab_size' is {vocab!r}; expected a positive int")
    eos = _eos(cfg.get("eos_token_id"), str(path))
    gen = target_dir / "generation_config.json"
    if gen.is_file():
        g = json.loads(gen.read_text())
        if "eos_token_id" in g:
            eos = _eos(g["eos_token_id"], str(gen))
    tokenizer = None
    if with_tokenizer and any((target_dir / f).is_file() for f in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    return ModelInfo(vocab, eos, tokenizer)


class TextStream:
    """Turn streamed token chunks into text deltas whose concatenation is decode(all tokens).
    A delta ending in an incomplete UTF-8 sequence (U+FFFD) is held back until it completes."""

    def __init__(self, decode: Callable[[Sequence[int]], str], prefix: Sequence[int] = ()):
        self._decode = decode
        self._ids: list[int] = list(prefix)     # a prefix (the prompt) is part of the first delta
        self._sent = 0

    def push(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        return self._take(text)

    def flush(self) -> str:
        return self._take(self._decode(self._ids))

    def _take(self, text: str) -> str:
        delta = text[self._sent:]
        self._sent = len(text)
        return delta
