"""Two executors serving the same arrivals in lockstep, a check after every step: how the
whole-forward K = 0 graphs are compared with another path's carried state (test_inflight on CPU,
test_gpu on CUDA)."""
import random
from typing import Callable, Sequence


def serve_in_lockstep(exs: Sequence, prompts: Sequence, lens: Sequence[int], rng: random.Random,
                      check: Callable[[int], None]) -> int:
    """Prompt i is submitted to every executor in the same step (0..2 arrivals a step, drawn from
    rng); every executor then steps once and check(step) runs. Returns the steps taken."""
    i = steps = 0
    while i < len(prompts) or exs[0].active or exs[0].waiting:
        for _ in range(rng.randint(0, 2)):
            if i < len(prompts):
                for ex in exs:
                    ex.submit(prompts[i], lens[i])
                i += 1
        for ex in exs:
            ex.step()
        steps += 1
        check(steps)
    return steps


def serve_arrivals(ex, prompts: Sequence, lens: Sequence[int], rng: random.Random) -> list:
    """Prompt i submitted as others decode, 0..2 arrivals a step (drawn from rng), until every
    request is done -> the handles in prompt order."""
    handles, i = [], 0
    while i < len(prompts) or ex.active or ex.waiting:
        for _ in range(rng.randint(0, 2)):
            if i < len(prompts):
                handles.append(ex.submit(prompts[i], lens[i]))
                i += 1
        ex.step()
    ex.run_until_idle()
    return handles
