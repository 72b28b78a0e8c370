"""Drive an Executor from one thread: closed loop at concurrency C, and prompt files.

Closed loop, C=2, 4 requests:  submit r0 r1 | step ... r1 done -> submit r2 | step ... -> all done
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from dynspec.artifacts import iter_jsonl
from dynspec.errors import DynspecError


@dataclass(frozen=True)
class Prompt:
    id: str
    input_ids: tuple[int, ...]


def read_prompts(path: str | Path, tokenize: Callable[[str], list[int]] | None) -> list[Prompt]:
    """JSONL lines {"id": ..., "input_ids": [...]} or {"id": ..., "prompt": "..."}."""
    out: list[Prompt] = []
    for _, where, obj in iter_jsonl(path, "prompts file"):
        if not isinstance(obj, dict):
            raise DynspecError(f"{where}: expected a JSON object")
        pid = str(obj.get("id", obj.get("task_id", len(out))))
        if "input_ids" in obj:
            ids = obj["input_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
                raise DynspecError(f"{where}: field 'input_ids' must be a non-empty list of token ids")
            flag = next((i for i, t in enumerate(ids) if isinstance(t, bool)), None)   # json true is an int
            if flag is not None:
                raise DynspecError(f"{where}: field 'input_ids' holds {json.dumps(ids[flag])} at index {flag}; "
                                   "token ids are integers, not booleans")
        elif "prompt" in obj:
            if not isinstance(obj["prompt"], str) or not obj["prompt"]:
                raise DynspecError(f"{where}: field 'prompt' must be a non-empty string")
            if tokenize is None:
                raise DynspecError(f"{where}: field 'prompt' needs a tokenizer in the target folder; give input_ids")
            ids = tokenize(obj["prompt"])
        else:
            raise DynspecError(f"{where}: needs field 'input_ids' or 'prompt'")
        out.append(Prompt(pid, tuple(ids)))
    if not out:
        raise DynspecError(f"prompts file {path} holds no prompts")
    return out


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
