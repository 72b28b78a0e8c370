"""Triton-free logic of the reference `dynspec` model: request parsing, streamed detokenization,
and executor stats -> metric updates. The python-backend model.py is a thin shell around this."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from dynspec.errors import DynspecError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class RequestError(DynspecError):
    """A bad inference request; the message goes back to the client as-is."""


@dataclass(frozen=True)
class ModelInfo:
    vocab_size: int
    eos_ids: tuple[int, ...]
    tokenizer: object | None = field(default=None, compare=False)

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def _eos(value, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DynspecError(f"{where}: field 'eos_token_id' must be an int or a list of ints, not {value!r}")
    return tuple(ids)


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


@dataclass(frozen=True)
class GenerateRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    stream: bool
    stop_ids: tuple[int, ...]


def _scalar(inputs: Mapping[str, np.ndarray], name: str, kinds: str, what: str):
    a = inputs.get(name)
    if a is None:
        return None
    if a.dtype.kind not in kinds:
        raise RequestError(f"input {name!r} has dtype {a.dtype}; expected {what}")
    if a.size != 1:
        raise RequestError(f"input {name!r} must hold exactly one value; got shape {list(a.shape)}")
    return a.reshape(-1)[0].item()


def _text(a: np.ndarray) -> str:
    if a.dtype.kind not in "OS":
        raise RequestError(f"input 'text_input' has dtype {a.dtype}; expected BYTES")
    if a.size != 1:
        raise RequestError(f"input 'text_input' must hold exactly one prompt; got shape {list(a.shape)}")
    raw = a.reshape(-1)[0]
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, bytes):
        raise RequestError(f"input 'text_input' holds {type(raw).__name__}; expected bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(
            f"input 'text_input' is not valid UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} ({e.reason})"
        ) from None


def _ids(a: np.ndarray, vocab_size: int) -> tuple[int, ...]:
    if a.dtype.kind not in "iu":
        raise RequestError(f"input 'input_ids' has dtype {a.dtype}; expected INT32")
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1:
        raise RequestError(f"input 'input_ids' must be one sequence [n] or [1, n]; got shape {list(a.shape)}")
    bad = np.flatnonzero((a < 0) | (a >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise RequestError(f"input 'input_ids'[{i}] = {int(a[i])} is outside the vocabulary 0..{vocab_size - 1}")
    return tuple(int(t) for t in a)


def parse_request(inputs: Mapping[str, np.ndarray], info: ModelInfo) -> GenerateRequest:
    """Inputs by name (absent ones missing or None) -> a checked request, or RequestError."""
    text, ids = inputs.get("text_input"), inputs.get("input_ids")
    if text is None and ids is None:
        raise RequestError("request has neither 'text_input' (BYTES) nor 'input_ids' (INT32); give one of them")
    if text is not None and ids is not None:
        raise RequestError("request has both 'text_input' and 'input_ids'; give one of them")
    if text is not None:
        prompt = _text(text)
        if info.tokenizer is None:
            raise RequestError("this model has no tokenizer (none in the target folder); send 'input_ids' instead")
        prompt_ids = tuple(int(t) for t in info.tokenizer.encode(prompt))
    else:
        prompt_ids = _ids(ids, info.vocab_size)
    if not prompt_ids:
        raise RequestError("the prompt is empty")
    max_tokens = _scalar(inputs, "max_tokens", "iu", "INT32")
    if max_tokens is None:
        raise RequestError("request has no 'max_tokens' (INT32)")
    if max_tokens < 1:
        raise RequestError(f"max_tokens={max_tokens} must be at least 1")
    stream = _scalar(inputs, "stream", "b", "BOOL")
    end_id = _scalar(inputs, "end_id", "iu", "INT32")
    stop_ids = info.eos_ids if end_id is None else ((int(end_id),) if end_id >= 0 else ())
    return GenerateRequest(prompt_ids, int(max_tokens), bool(stream), stop_ids)


class TextStream:
    """Turn streamed token chunks into text deltas whose concatenation is decode(all tokens).
    A delta ending in an incomplete UTF-8 sequence (U+FFFD) is held back until it completes."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
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


@dataclass(frozen=True)
class MetricsSample:
    draft_len: int | None               # K of the latest iteration; None before the first one
    batch_size: int                     # b of the latest iteration; 0 once the executor is idle
    drafted: int                        # draft tokens proposed since the previous sample
    accepted: int                       # draft tokens accepted since the previous sample
    iterations_by_k: Mapping[int, int]  # iterations since the previous sample, by K


class StatsCursor:
    """Reads an executor's IterationStats by iteration number; each sample covers iterations
    not seen before. Feed it `executor.stats_since(cursor.next)`: the executor keeps only the
    newest iterations, so positions in its log are not stable, iteration numbers are."""

    def __init__(self) -> None:
        self.next = 0
        self._k: int | None = None
        self._b = 0

    def sample(self, stats: Sequence, busy: bool) -> MetricsSample:
        new = [st for st in stats if st.iteration >= self.next]
        if new:
            self.next = new[-1].iteration + 1
        by_k: dict[int, int] = {}
        for st in new:
            by_k[st.k] = by_k.get(st.k, 0) + 1
        if new:
            self._k, self._b = new[-1].k, new[-1].batch_size
        elif not busy:
            self._b = 0
        return MetricsSample(self._k, self._b, sum(s.drafted for s in new), sum(s.accepted for s in new), by_k)
