"""Record an acceptance trace of a real target + EAGLE-3 draft pair (the embedded tiny pair).

    python -m dynspec.benchmarks.record_trace --out benchmarks/traces/tiny_pair.json \\
        --prompts 32 --new 96 --kmax 8

For each held-out prompt (decode.check_prompts: windows of the stdlib modules that the
pair's build_info.json records as held out of training) the target decodes greedily, and at
every output offset t = 0..new-1 a greedy draft chain of depth kmax starts from the true
prefix; r_t = how many of its drafts equal the target's greedy tokens t+1.. in a row. The file
format and replay: runtime/policy/acceptance_trace.py, runtime/policy/acceptance.py (TraceReplay).

    prompt p (n tokens) + greedy out[0..new+kmax-1]        out[0] comes from the prefill
    chain at t: draft rows @0..@n+t-1 from the target's captures, then kmax chain steps
    r_t = leading matches of (d_1..d_kmax) with out[t+1..t+kmax]
"""
from __future__ import annotations

import argparse
import platform
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path

TRACE = Path(__file__).resolve().parent / "traces" / "tiny_pair.json"     # the committed trace


@contextmanager
def one_thread():
    """torch on one CPU thread for the block: the tiny pair gains nothing from more, and beside
    other busy processes two spinning threads ran 10-50x slower than one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def chain_runs(target, draft, prompt: list[int], new: int, kmax: int) -> list[int]:
    """r_t for t = 0..new-1 of one prompt (batch = the new chains; index convention of
    decode.spec_decode: draft row @p pairs the capture at p with the token at p+1).
    Example: new=3, kmax=2 -> e.g. [2, 0, 1]."""
    import torch

    from dynspec.pairs.decode import greedy_continue
    from dynspec.runtime.policy.acceptance import accepted_prefix

    with torch.no_grad():
        n = len(prompt)
        seq = greedy_continue(target, torch.tensor([prompt]), new + kmax)[0]        # [T]
        T, P = seq.numel(), n + new - 1                  # rows @0..@P-1 are all any chain reads
        target.setup_cache(1, T)
        _, hid = target(seq[None], torch.arange(T)[None], capture=draft.capture_layers)   # [1, T, n*h]
        draft.setup_cache(new, T + 1)
        dl, dh = draft(seq[1:P + 1].expand(new, P), hid[:, :P].expand(new, P, -1),
                       torch.arange(P).expand(new, P))                             # [new, P, dv], [new, P, h]
        q = n + torch.arange(new)                        # [new] position of chain t's last emitted token
        rows = torch.arange(new)
        logit, h = dl[rows, q - 1], dh[rows, q - 1][:, None]                       # [new, dv], [new, 1, h]
        drafts = []
        for s in range(kmax):
            d = draft.to_target_ids(logit.argmax(-1))                              # [new]
            drafts.append(d)
            if s < kmax - 1:
                dl1, h = draft(d[:, None], h, (q + s)[:, None])                    # row @q+s
                logit = dl1[:, -1]
        truth = seq[q[:, None] + 1 + torch.arange(kmax)]                           # [new, kmax]
        return [int(x) for x in accepted_prefix(torch.stack(drafts, 1) == truth)]


def replay_steps(r: list[int], new: int, k: int) -> list[int]:
    """Per-step accepted counts of greedy K-chain decoding of `new` tokens replayed from r, as
    decode.spec_decode counts them. r = [2, 0, 0, 1, 0], new=5, k=2 -> [2, 1]."""
    out, steps = 1, []
    while out < new:
        a = min(r[out - 1], k)
        steps.append(a)
        out += a + 1
    return steps


def record(folder: Path, prompts: int, new: int, kmax: int, prompt_len: int, command: str,
           progress: bool = True):
    """The Trace of `prompts` held-out prompts of the pair in FOLDER."""
    import torch
    from tqdm import tqdm

    from dynspec.corpus import ASSET_DIR, recorded_split
    from dynspec.pairs.decode import check_prompts
    from dynspec.runtime.policy.acceptance_trace import Trace
    from dynspec.runtime.engines.reference.load import load_draft, load_target

    target = load_target(folder / "target")
    draft = load_draft(folder / "draft", target)
    ids = check_prompts(folder, prompts, prompt_len)
    with one_thread():
        reqs = [tuple(chain_runs(target, draft, p, new, kmax))
                for p in tqdm(ids, desc="record", unit="prompt", file=sys.stderr, disable=not progress)]
    same = folder.resolve() == Path(ASSET_DIR).resolve()
    source = {
        "pair": "dynspec/assets/tiny (the embedded tiny pair)" if same else str(folder),
        "prompts": {"n": prompts, "length": prompt_len, "seed": 0,
                    "from": "tiny_pair.check_prompts: windows of the held-out stdlib modules",
                    "held_out_files": len(recorded_split(folder)[1])},
        "new_tokens": new, "kmax": kmax,
        "decoding": "greedy target; at each offset a greedy EAGLE-3 chain from the true prefix",
        "command": command, "python": platform.python_version(), "torch": torch.__version__,
    }
    return Trace(kmax, tuple(reqs), source)


def make_parser() -> argparse.ArgumentParser:
    from dynspec.parsers import DefaultsFormatter

    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.record_trace", description=__doc__.splitlines()[0],
                                allow_abbrev=False, formatter_class=DefaultsFormatter)
    p.add_argument("--out", required=True, metavar="PATH", help="the trace file to write (JSON)")
    p.add_argument("--prompts", type=int, default=32, metavar="N", help="held-out prompts (one request each)")
    p.add_argument("--new", type=int, default=96, metavar="N", help="output offsets recorded per request")
    p.add_argument("--kmax", type=int, default=8, metavar="K", help="chain depth: r_t is at most K")
    p.add_argument("--prompt-len", type=int, default=48, metavar="N", help="tokens per prompt")
    p.add_argument("--pair", metavar="DIR", help="pair folder with target/ and draft/ (default: the embedded tiny pair)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(args: argparse.Namespace, command: str) -> dict:
    from dynspec.corpus import ASSET_DIR
    from dynspec.errors import DynspecError
    from dynspec.runtime.policy.acceptance_trace import MAX_KMAX, summary, write_trace

    for flag, v, lo in (("--prompts", args.prompts, 1), ("--new", args.new, 2), ("--kmax", args.kmax, 1),
                        ("--prompt-len", args.prompt_len, 2)):
        if v < lo:
            raise DynspecError(f"{flag} {v}: need at least {lo}")
    if args.kmax > MAX_KMAX:
        raise DynspecError(f"--kmax {args.kmax}: at most {MAX_KMAX}")
    folder = Path(args.pair) if args.pair else Path(ASSET_DIR)
    trace = record(folder, args.prompts, args.new, args.kmax, args.prompt_len, command, not args.no_progress)
    write_trace(args.out, trace)
    return summary(trace)


def main(argv: list[str] | None = None) -> int:
    import json

    from dynspec.errors import DynspecError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    try:
        info = run(args, "python -m dynspec.benchmarks.record_trace " + shlex.join(argv))
    except DynspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
