"""Drive an Executor from one thread: closed loop at concurrency C, and prompt files.

Closed loop, C=2, 4 requests:  submit r0 r1 | step ... r1 done -> submit r2 | step ... -> all done
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from dynspec.errors import DynspecError

MAX_PROMPT_LINE_BYTES = 16 * 2**20   # one line: a prompt of ~2M token ids as JSON
MAX_PROMPTS = 1_000_000             # lines per prompts file


@dataclass(frozen=True)
class Prompt:
    id: str
    input_ids: tuple[int, ...]


@dataclass(frozen=True)
class PromptLine:
    """One checked line of a prompts file, not yet tokenized: exactly one of input_ids / text."""
    where: str                              # FILE:LINE
    id: str
    input_ids: tuple[int, ...] | None
    text: str | None


def iter_jsonl_lines(path: str | Path, what: str = "prompts file", max_line_bytes: int | None = None,
                     max_lines: int | None = None):
    """Yield (line number, 'FILE:LINE', object) for each non-blank line of a JSONL file, reading
    one line at a time and at most max_line_bytes of it: a 1 GB file of NUL bytes with no newline
    costs one bounded read, then "FILE:1: line longer than 16,777,216 bytes". More than max_lines
    non-blank lines is refused at the first one over. The one reader of prompts and dataset files."""
    max_line_bytes = MAX_PROMPT_LINE_BYTES if max_line_bytes is None else max_line_bytes
    max_lines = MAX_PROMPTS if max_lines is None else max_lines
    path = Path(path)
    if not path.is_file():
        raise DynspecError(f"{what} {path} does not exist")
    seen = 0
    with path.open("rb") as f:
        lineno = 0
        while raw := f.readline(max_line_bytes + 1):
            lineno += 1
            where = f"{path}:{lineno}"
            if len(raw) > max_line_bytes:
                raise DynspecError(f"{where}: line longer than {max_line_bytes:,} bytes; one line is one prompt")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DynspecError(f"{where}: not UTF-8 text (byte {e.start} of the line)") from None
            if not line.strip():
                continue
            seen += 1
            if seen > max_lines:
                raise DynspecError(f"{where}: {what} {path} holds more than {max_lines} prompts")
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DynspecError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from e
            except RecursionError:
                raise DynspecError(f"{where}: nested too deeply to be a prompt") from None
            yield lineno, where, obj


def read_prompt_lines(path: str | Path) -> list[PromptLine]:
    """The prompts JSONL format, every line checked (naming FILE:LINE) before anything runs.
    A line holds exactly one of:
        {"id": "a", "input_ids": [1, 2, 3]}     ints >= 0 only: true, 2.0 and 1e23 are not token ids
        {"id": "b", "prompt": "def f():"}       UTF-8 text: no lone surrogate such as "\\ud800"
    """
    out: list[PromptLine] = []
    for _, where, obj in iter_jsonl_lines(path, "prompts file"):
        if not isinstance(obj, dict):
            raise DynspecError(f"{where}: expected a JSON object")
        pid = str(obj.get("id", obj.get("task_id", len(out))))
        if "input_ids" in obj and "prompt" in obj:
            raise DynspecError(f"{where}: has both 'input_ids' and 'prompt'; give one")
        if "input_ids" in obj:
            ids = obj["input_ids"]
            if not isinstance(ids, list) or not ids:
                raise DynspecError(f"{where}: field 'input_ids' must be a non-empty list of token ids")
            for i, t in enumerate(ids):
                if isinstance(t, bool):                     # json true is an int to Python
                    raise DynspecError(f"{where}: field 'input_ids' holds {json.dumps(t)} at index {i}; "
                                       "token ids are integers, not booleans")
                if not isinstance(t, int) or t < 0:
                    raise DynspecError(
                        f"{where}: input_ids[{i}] = {json.dumps(t)} is not a token id (an integer >= 0)")
            out.append(PromptLine(where, pid, tuple(ids), None))
        elif "prompt" in obj:
            text = obj["prompt"]
            if not isinstance(text, str) or not text:
                raise DynspecError(f"{where}: field 'prompt' must be a non-empty string")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise DynspecError(f"{where}: field 'prompt' holds a lone surrogate "
                                   f"{text[e.start]!r} at character {e.start}") from None
            out.append(PromptLine(where, pid, None, text))
        else:
            raise DynspecError(f"{where}: needs field 'input_ids' or 'prompt'")
    if not out:
        raise DynspecError(f"prompts file {path} holds no prompts")
    return out


def tokenized(lines: Sequence[PromptLine], tokenize: Callable[[str], list[int]] | None) -> list[Prompt]:
    """Prompts with token ids: input_ids as given, text through `tokenize`."""
    out = []
    for line in lines:
        if line.input_ids is None and tokenize is None:
            raise DynspecError(f"{line.where}: field 'prompt' needs a tokenizer in the target folder; give input_ids")
        out.append(Prompt(line.id, line.input_ids if line.input_ids is not None else tuple(tokenize(line.text))))
    return out


def read_prompts(path: str | Path, tokenize: Callable[[str], list[int]] | None) -> list[Prompt]:
    """JSONL lines {"id": ..., "input_ids": [...]} or {"id": ..., "prompt": "..."} -> Prompts."""
    return tokenized(read_prompt_lines(path), tokenize)


def closed_loop(executor, jobs: Sequence[tuple[Sequence[int], int]], concurrency: int,
                stop_ids: Sequence[int] = (), *, on_step: Callable | None = None,
                on_done: Callable[[list], None] | None = None) -> list:
    """Run (prompt_ids, max_new_tokens) jobs with at most `concurrency` in flight, admitting the
    next as one finishes. on_step gets each IterationStats, on_done each group of handles that
    finished (in submission order). Returns the handles in job order."""
    if concurrency < 1:
        raise DynspecError(f"concurrency={concurrency} must be at least 1")
    handles: list = [None] * len(jobs)
    nxt, live, idle = 0, [], 0
    while nxt < len(jobs) or live:
        while nxt < len(jobs) and len(live) < concurrency:
            prompt, max_new = jobs[nxt]
            handles[nxt] = executor.submit(prompt, max_new, stop_ids)
            live.append(handles[nxt])
            nxt += 1
        st = executor.step()
        if st is not None and on_step is not None:
            on_step(st)
        done = [h for h in live if h.done]
        if done and on_done is not None:
            on_done(done)
        live = [h for h in live if not h.done]
        idle = idle + 1 if st is None and not done else 0
        if idle > 3:
            raise RuntimeError(f"executor made no progress with {len(live)} requests in flight")
    return handles


def run_closed_loop(executor, prompts: Sequence[Sequence[int]], max_new_tokens: int, concurrency: int,
                    stop_ids: Sequence[int] = (), progress=None) -> list:
    """Every prompt with the same max_new_tokens; returns RequestResults in prompt order."""
    on_done = (lambda hs: progress.update(len(hs))) if progress is not None else None
    handles = closed_loop(executor, [(p, max_new_tokens) for p in prompts], concurrency, stop_ids,
                          on_done=on_done)
    return [h.result() for h in handles]


def describe_schedule(schedule) -> str:
    """A DraftSchedule in words, for startup logs:
    4:4,8:2 -> '4:4,8:2 (K=4 for b<=4, K=2 for b<=8, K=0 above)'; no tiers -> 'none (K=0 at every batch size)'."""
    return f"{schedule.to_spec()} ({schedule_words(schedule)})" if schedule.tiers else f"none ({schedule_words(schedule)})"


def schedule_words(schedule) -> str:
    """4:4,8:2 -> 'K=4 for b<=4, K=2 for b<=8, K=0 above'; no tiers -> 'K=0 at every batch size'."""
    if not schedule.tiers:
        return "K=0 at every batch size"
    return ", ".join(f"K={k} for b<={b}" for b, k in schedule.tiers) + ", K=0 above"


def describe_policy(policy, cost_model: str | Path | None = None) -> str:
    """The policy kind in words: a DraftSchedule -> 'schedule'; capped (engine.json prefill_k) ->
    'schedule (K<=0 on steps that end a prefill)'; a cost-model policy -> its registered name
    (runtime/policy/__init__.py POLICIES) and candidates: 'adaptive (cost model FILE, K 0..4)', 'K 0,2,4'
    when they are not consecutive."""
    from dynspec.runtime.policy import POLICIES, registered_name
    from dynspec.runtime.policy.prefill_cap import PrefillCap

    name = registered_name(policy)
    if isinstance(policy, PrefillCap):
        return f"{name} ({policy.limit} on steps that end a prefill)"
    if not POLICIES[name].cost_model:
        return name
    ks = sorted(policy.candidates)
    span = f"{ks[0]}..{ks[-1]}" if ks == list(range(ks[0], ks[-1] + 1)) and len(ks) > 1 else ",".join(map(str, ks))
    return f"{name} (cost model {cost_model}, K {span})"
