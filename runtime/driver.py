"""Drive an Executor from one thread: closed loop at concurrency C, and prompt files.

Closed loop, C=2, 4 requests:  submit r0 r1 | step ... r1 done -> submit r2 | step ... -> all done
"""
from __future__ import annotations

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


def run_closed_loop(executor, prompts: Sequence[Sequence[int]], max_new_tokens: int, concurrency: int,
                    stop_ids: Sequence[int] = (), progress=None) -> list:
    """At most `concurrency` requests in flight; the next is admitted as one finishes.
    Returns RequestResults in prompt order."""
    if concurrency < 1:
        raise DynspecError(f"concurrency={concurrency} must be at least 1")
    handles: list = [None] * len(prompts)
    nxt, live = 0, []
    while nxt < len(prompts) or live:
        while nxt < len(prompts) and len(live) < concurrency:
            handles[nxt] = executor.submit(prompts[nxt], max_new_tokens, stop_ids)
            live.append(handles[nxt])
            nxt += 1
        executor.step()
        still = [h for h in live if not h.done]
        if progress is not None and len(still) != len(live):
            progress.update(len(live) - len(still))
        live = still
    return [h.result() for h in handles]
