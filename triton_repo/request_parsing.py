"""Request parsing of the reference `dynspec` model: the inputs of a Triton request (numpy arrays by
name) -> a checked GenerateRequest, or a RequestError whose message goes back to the client.

    parse_request({"input_ids": int32 [n] or [1, n], "max_tokens": int32 [1], ...}, info) -> GenerateRequest
    check_parameters(request parameters)     refuses any (over HTTP, undeclared JSON keys arrive as these)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from dynspec.errors import DynspecError
from dynspec.triton_repo.serving import ModelInfo
from dynspec.triton_repo.words import check_word_bounds


class RequestError(DynspecError):
    """A bad inference request; the message goes back to the client as-is."""


@dataclass(frozen=True)
class GenerateRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    stream: bool
    stop_ids: tuple[int, ...]
    exclude_input: bool = True                                  # False: outputs start with the prompt
    min_length: int = 0                                         # end_id may not come before this many tokens
    stop_words: tuple[tuple[int, ...], ...] = ()                # the output ends after any of these
    bad_words: tuple[tuple[str, tuple[int, ...]], ...] = ()     # (word, ids) the output may not contain


# The optional inputs of tensorrtllm_backend's text-level model (TensorRT-LLM
# triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt), plus the older names
# `min_length` and `random_seed` (tensorrtllm_backend's ensemble before they were renamed; genai-perf
# 0.0.16 still sends `min_length`). Each one is honoured, or refused with a message when its value
# asks for what a greedy, single-beam decoder without logit processing cannot give.
#   honoured: exclude_input_in_output, end_id, pad_id (outputs are never padded), min_length /
#     min_tokens, stop_words, bad_words (see words.OutputWatch), length_penalty (beam search only),
#     random_seed / seed (sampling only)
#   neutral value only (anything else is refused): GREEDY_ONLY below, top_k / top_p (greedy_rules)
GREEDY_ONLY = {            # input: (the value that leaves greedy decoding unchanged, dtype kinds)
    "temperature": (1.0, "fiu"),
    "repetition_penalty": (1.0, "fiu"),
    "presence_penalty": (0.0, "fiu"),
    "frequency_penalty": (0.0, "fiu"),
    "beam_width": (1, "iu"),
    "num_return_sequences": (1, "iu"),
    "return_log_probs": (False, "b"),
    "return_context_logits": (False, "b"),
    "return_generation_logits": (False, "b"),
}
NO_EFFECT = {"pad_id": "iu", "length_penalty": "fiu", "random_seed": "iu", "seed": "iu"}
INPUT_NAMES = ("text_input", "input_ids", "max_tokens", "stream", "end_id", "exclude_input_in_output",
               "min_length", "min_tokens", "stop_words", "bad_words", "top_k", "top_p",
               *GREEDY_ONLY, *NO_EFFECT)


def _scalar(inputs: Mapping[str, np.ndarray], name: str, kinds: str, what: str):
    a = inputs.get(name)
    if a is None:
        return None
    if a.dtype.kind not in kinds:
        raise RequestError(f"input {name!r} has dtype {a.dtype}; expected {what}")
    if a.size != 1:
        raise RequestError(f"input {name!r} must hold exactly one value; got shape {list(a.shape)}")
    return a.reshape(-1)[0].item()


def _text(a: np.ndarray, max_bytes: int | None = None) -> str:
    if a.dtype.kind not in "OS":
        raise RequestError(f"input 'text_input' has dtype {a.dtype}; expected BYTES")
    if a.size != 1:
        raise RequestError(f"input 'text_input' must hold exactly one prompt; got shape {list(a.shape)}")
    raw = a.reshape(-1)[0]
    if not isinstance(raw, (bytes, str)):
        raise RequestError(f"input 'text_input' holds {type(raw).__name__}; expected bytes")
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if max_bytes is not None and size > max_bytes:
        raise RequestError(f"input 'text_input' is {size} bytes; prompts over {max_bytes} bytes have more tokens "
                           "than this engine's max_seq_len (refused before tokenizing)")
    if isinstance(raw, str):
        return raw
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
        prompt = _text(text, info.max_prompt_bytes)
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
    exclude = _scalar(inputs, "exclude_input_in_output", "b", "BOOL")
    greedy_rules(inputs)
    for name, kinds in NO_EFFECT.items():
        _scalar(inputs, name, kinds, "a number")
    return GenerateRequest(prompt_ids, int(max_tokens), bool(stream), stop_ids,
                           exclude_input=True if exclude is None else bool(exclude),
                           min_length=_min_length(inputs),
                           stop_words=tuple(ids for _, ids in _words(inputs, "stop_words", info)),
                           bad_words=_words(inputs, "bad_words", info))


def check_parameters(parameters: Mapping[str, object]) -> None:
    """Request parameters are refused: over HTTP generate, a JSON key that is not a declared input
    arrives as a parameter, and dropping it would answer a request that was not asked."""
    if parameters:
        names = ", ".join(sorted(map(repr, parameters)))
        raise RequestError(f"unsupported request parameter(s) {names}: this model takes only the inputs "
                           f"{', '.join(INPUT_NAMES)}")


def greedy_rules(inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse every value that asks for something other than greedy single-beam decoding.
    top_k: 0 (unset) or 1. top_p > 0 samples unless top_k is 1 (tensorrtllm_backend samples with
    top_k 0 and top_p > 0). temperature is neutral at 1.0, and also with top_k 1 (argmax is unchanged)."""
    top_k = _scalar(inputs, "top_k", "iu", "INT32")
    top_p = _scalar(inputs, "top_p", "fiu", "FP32")
    if top_k is not None and top_k not in (0, 1):
        raise RequestError(f"top_k={top_k} asks for sampling; this model decodes greedily (the reference "
                           "executor has no sampler): send top_k 0 or 1, or leave it out")
    if top_p is not None and not 0.0 <= top_p <= 1.0:
        raise RequestError(f"top_p={top_p:g} is outside 0..1")
    if top_p is not None and top_p > 0.0 and top_k != 1:
        raise RequestError(f"top_p={top_p:g} asks for sampling; this model decodes greedily (the reference "
                           "executor has no sampler): leave top_p out, send 0, or send top_k 1")
    for name, (neutral, kinds) in GREEDY_ONLY.items():
        value = _scalar(inputs, name, kinds, type(neutral).__name__.upper().replace("FLOAT", "FP32"))
        if value is None or value == neutral or (name == "temperature" and top_k == 1 and value > 0):
            continue
        shown = str(value).lower() if isinstance(neutral, bool) else f"{value:g}"
        raise RequestError(f"{name}={shown} is not supported: this model decodes greedily with one beam and "
                           f"returns no log probabilities or logits; leave {name} out or send "
                           f"{str(neutral).lower() if isinstance(neutral, bool) else neutral}")


def _min_length(inputs: Mapping[str, np.ndarray]) -> int:
    values = {n: _scalar(inputs, n, "iu", "INT32") for n in ("min_length", "min_tokens")}
    given = {n: v for n, v in values.items() if v is not None}
    for n, v in given.items():
        if v < 0:
            raise RequestError(f"{n}={v} must be at least 0")
    if len(set(given.values())) > 1:
        raise RequestError(f"min_length={given['min_length']} and min_tokens={given['min_tokens']} disagree; "
                           "they are one setting, give one")
    return int(next(iter(given.values()), 0))


def _words(inputs: Mapping[str, np.ndarray], name: str, info: ModelInfo) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """BYTES [n] words -> ((word, token ids), ...), tokenized without special tokens, as
    tensorrtllm_backend's preprocessing does. An empty word or one without a tokenizer is an error,
    and so are more words or bytes than words.check_word_bounds allows (before any is tokenized)."""
    a = inputs.get(name)
    if a is None:
        return ()
    if a.dtype.kind not in "OS":
        raise RequestError(f"input {name!r} has dtype {a.dtype}; expected BYTES")
    try:
        check_word_bounds(name, a.reshape(-1))
    except ValueError as e:
        raise RequestError(str(e)) from None
    out = []
    for raw in a.reshape(-1):
        try:
            word = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            raise RequestError(f"input {name!r} holds {raw!r}, which is not valid UTF-8") from None
        if info.tokenizer is None:
            raise RequestError(f"input {name!r} needs a tokenizer and this model has none")
        ids = tuple(int(t) for t in info.encode_words(word))
        if not ids:
            raise RequestError(f"input {name!r} holds {word!r}, which has no tokens")
        out.append((word, ids))
    return tuple(out)
