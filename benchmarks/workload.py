"""Benchmark requests: a JSONL dataset in trtllm-bench's format, or seeded synthetic lengths.

trtllm-bench dataset, one JSON object per line:
    {"task_id": 0, "input_ids": [128000, 791, 4062], "output_tokens": 128}
    {"task_id": 1, "prompt": "Tell me a story", "output_tokens": 64}      # needs a tokenizer
Other keys trtllm-bench may write (e.g. "logits", "lora_request") are ignored.

Synthetic workloads draw lengths from a `LengthDist` and token ids uniformly from the
vocabulary, all from one seed, so every mode of a sweep sees the very same requests:
    LengthDist.parse("128")     -> always 128
    LengthDist.parse("64:192")  -> uniform on 64..192 inclusive
"""
from __future__ import annotations

import heapq
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from dynspec.errors import DynspecError
from dynspec.runtime.serving.driver import iter_jsonl_lines

Tokenizer = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class BenchRequest:
    task_id: int | str
    input_ids: tuple[int, ...]
    output_tokens: int

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    def to_json(self) -> dict:
        return {"task_id": self.task_id, "input_ids": list(self.input_ids), "output_tokens": self.output_tokens}


@dataclass(frozen=True)
class LengthDist:
    lo: int
    hi: int        # inclusive; lo == hi is a fixed length

    def __post_init__(self) -> None:
        if self.lo < 1 or self.hi < self.lo:
            raise DynspecError(f"length range {self.lo}:{self.hi} is empty or below 1")

    @classmethod
    def parse(cls, text: str | int, what: str = "length") -> "LengthDist":
        s = str(text).strip()
        m = re.fullmatch(r"(\d+)(?:\s*:\s*(\d+))?", s)
        if not m:
            raise DynspecError(f"{what} {text!r} is not N or LO:HI (e.g. 128 or 64:192)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        try:
            return cls(lo, hi)
        except DynspecError as e:
            raise DynspecError(f"{what} {text!r}: {e}") from e

    @property
    def max(self) -> int:
        return self.hi

    @property
    def mean(self) -> float:
        return (self.lo + self.hi) / 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.lo, self.hi + 1, size=n)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


def synthetic_lengths(n: int, input_len: LengthDist, output_len: LengthDist, seed: int = 0
                      ) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    """(prompt lengths [n], output lengths [n], the generator after them): the first draws of every
    seeded workload (synthetic, text_windows), so its lengths follow from n and the seed alone."""
    if n < 1:
        raise DynspecError(f"number of requests {n} must be at least 1")
    rng = np.random.default_rng(seed)
    ins = input_len.sample(rng, n)
    return ins, output_len.sample(rng, n), rng


def closed_loop_iterations(output_lens: Sequence[int], concurrency: int, lag: int = 0) -> int:
    """The fewest iterations a closed loop of `concurrency` clients needs for these requests,
    submitted in order, when every row yields one token an iteration (K=0) and nothing else limits
    a step (no token budget): a request holds its slot for its output length (its prompt's
    iteration yields the first token), and the next request takes the slot `lag` iterations after
    its last token (0: the serial loop admits it in the next iteration; 1: the overlapped loop
    learns of the finish one launch later). Any executor serving the workload at K=0 needs at least
    this many; one with a token budget can need more (prompts chunked over several iterations).
    Example: outputs (3, 1, 2) at C=2 -> slot 0 runs iterations 0-2, slot 1 runs 0 then 1-2: 3;
    with lag=1, slot 1 runs 0 then 2-3: 4."""
    if concurrency < 1 or lag < 0:
        raise DynspecError(f"concurrency {concurrency} must be at least 1 and lag {lag} at least 0")
    free = [(0, slot) for slot in range(concurrency)]       # (iteration the slot is free from, slot)
    end = 0
    for n in output_lens:
        t, slot = heapq.heappop(free)
        end = max(end, t + int(n))
        heapq.heappush(free, (t + int(n) + lag, slot))
    return end


def synthetic(n: int, input_len: LengthDist, output_len: LengthDist, vocab_size: int, seed: int = 0,
              first_id: int = 0) -> tuple[BenchRequest, ...]:
    """n requests with seeded random lengths and token ids in [first_id, vocab_size)."""
    if vocab_size <= first_id:
        raise DynspecError(f"vocab_size {vocab_size} leaves no token ids above first_id {first_id}")
    ins, outs, rng = synthetic_lengths(n, input_len, output_len, seed)
    return tuple(
        BenchRequest(i, tuple(int(t) for t in rng.integers(first_id, vocab_size, size=int(p))), int(o))
        for i, (p, o) in enumerate(zip(ins, outs))
    )


def text_windows(token_streams: Sequence[Sequence[int]], n: int, input_len: LengthDist, output_len: LengthDist,
                 seed: int = 0) -> tuple[BenchRequest, ...]:
    """n prompts cut from tokenized texts at seeded random offsets (real text -> real acceptance).

    streams [[1..100], [7..20]], input_len 10: request i takes a random stream that is long
    enough and 10 consecutive tokens from a random start in it."""
    ins, outs, rng = synthetic_lengths(n, input_len, output_len, seed)
    reqs = []
    for i, (p, o) in enumerate(zip(ins, outs)):
        fits = [s for s in token_streams if len(s) >= p]
        if not fits:
            raise DynspecError(f"no text is {int(p)} tokens long; lower --input-len")
        s = fits[int(rng.integers(len(fits)))]
        start = int(rng.integers(len(s) - p + 1))
        reqs.append(BenchRequest(i, tuple(int(t) for t in s[start:start + int(p)]), int(o)))
    return tuple(reqs)


def stdlib_token_streams(tokenizer: Tokenizer) -> list[list[int]]:
    """The held-out Python standard-library modules the tiny pair was NOT trained on, tokenized."""
    from dynspec.corpus import read_texts, stdlib_files

    _, held = stdlib_files()
    return [list(tokenizer(t)) for t in read_texts(held)]


def parse_line(obj: object, where: str, tokenizer: Tokenizer | None = None) -> BenchRequest:
    """One decoded JSONL object -> BenchRequest; `where` is 'FILE:LINE' for error messages."""
    if not isinstance(obj, dict):
        raise DynspecError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "task_id" not in obj:
        raise DynspecError(f"{where}: missing field 'task_id'")
    task_id = obj["task_id"]
    if not isinstance(task_id, (int, str)) or isinstance(task_id, bool):
        raise DynspecError(f"{where}: field 'task_id' must be an integer or string, got {task_id!r}")
    out = obj.get("output_tokens")
    if out is None:
        raise DynspecError(f"{where}: missing field 'output_tokens'")
    if not isinstance(out, int) or isinstance(out, bool) or out < 1:
        raise DynspecError(f"{where}: field 'output_tokens' must be a positive integer, got {out!r}")
    has_ids, has_prompt = "input_ids" in obj, "prompt" in obj
    if has_ids == has_prompt:
        raise DynspecError(f"{where}: give exactly one of 'input_ids' and 'prompt'")
    if has_ids:
        ids = obj["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise DynspecError(f"{where}: field 'input_ids' must be a non-empty list of token ids")
        for j, t in enumerate(ids):
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise DynspecError(f"{where}: field 'input_ids'[{j}] = {t!r} is not a token id")
    else:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise DynspecError(f"{where}: field 'prompt' must be a non-empty string")
        if tokenizer is None:
            raise DynspecError(f"{where}: field 'prompt' needs a tokenizer; none was found for this model"
                               " (write 'input_ids' instead, or give a target dir with a tokenizer)")
        ids = list(tokenizer(prompt))
        if not ids:
            raise DynspecError(f"{where}: prompt {prompt[:40]!r} tokenizes to nothing")
    return BenchRequest(task_id, tuple(int(t) for t in ids), out)


def load_jsonl(path: str | os.PathLike, tokenizer: Tokenizer | None = None) -> tuple[BenchRequest, ...]:
    """Read a trtllm-bench JSONL dataset. Bad lines raise DynspecError naming FILE:LINE."""
    reqs: list[BenchRequest] = []
    seen: dict = {}
    for lineno, where, obj in iter_jsonl_lines(path, "dataset"):
        req = parse_line(obj, where, tokenizer)
        if req.task_id in seen:
            raise DynspecError(f"{where}: duplicate task_id {req.task_id!r} (first on line {seen[req.task_id]})")
        seen[req.task_id] = lineno
        reqs.append(req)
    if not reqs:
        raise DynspecError(f"dataset {path} holds no requests")
    return tuple(reqs)


def write_jsonl(path: str | os.PathLike, requests: Iterable[BenchRequest]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        for r in requests:
            f.write(json.dumps(r.to_json()) + "\n")
    tmp.replace(path)


def take(requests: Sequence[BenchRequest], n: int, offset: int = 0) -> tuple[BenchRequest, ...]:
    """n requests starting at `offset`, cycling through the dataset when it is shorter.

    Rank r of a sweep with n requests per replica takes take(reqs, n, r * n): disjoint
    shards while the dataset lasts, the same requests for every mode."""
    if not requests:
        raise DynspecError("no requests to take from")
    return tuple(requests[(offset + i) % len(requests)] for i in range(n))


def check_fits(requests: Sequence[BenchRequest], max_seq_len: int, max_draft_len: int, vocab_size: int | None,
               where: str = "workload") -> None:
    """Every request must fit the engine's cache (prompt + output + verify slack) and vocabulary."""
    for r in requests:
        need = r.input_len + r.output_tokens + max_draft_len + 1
        if need > max_seq_len:
            raise DynspecError(
                f"{where}: task {r.task_id!r} needs {r.input_len} prompt + {r.output_tokens} output"
                f" + {max_draft_len + 1} verify slack = {need} cache positions; the engine has max_seq_len={max_seq_len}"
            )
        if vocab_size is not None and max(r.input_ids) >= vocab_size:
            raise DynspecError(f"{where}: task {r.task_id!r} has token id {max(r.input_ids)} >= vocab size {vocab_size}")
