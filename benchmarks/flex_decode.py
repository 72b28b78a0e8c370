"""Paged decode attention alone, per batch size: why does the decode step grow so fast with b?

    python -m dynspec.benchmarks.flex_decode --device cuda --out flex_decode.json

Llama-3.1-8B's attention shape (32 q heads, 8 KV heads of 128, bf16), 128-token blocks, each
of b rows at --context tokens, one query each (plain decode). Timed inside a CUDA graph
(median of --repeats replays), per variant:
    flex        attention.flex_attention_paged over a pool as the engine sizes it
                (--pool-rows rows of --max-seq-len: every block of the pool in the mask's range),
                through the engine's compile, which marks the batch static (one version per b)
    flex_small  the same over a pool of exactly the b rows' blocks (does the pool's length cost?)
    flex_main   as `flex`, with kernel_options FORCE_USE_FLEX_ATTENTION (the non-decoding kernel)
    flex_static as `flex`, compiled apart with dynamic=False
    flex_dynamic as `flex`, compiled apart without marking the batch static (the engine up to
                `9f5c21e`): automatic dynamic makes the batch symbolic from the second
                b on, and inductor then uses its main kernel, not the split-KV decoding one
    sdpa        attention.sdpa_attention (gather the rows' blocks, then SDPA)
    triton      paged_decode.paged_decode_attention (one Triton launch: splits and their merge);
                `triton-w2-s1-t128-p4` the same with num_warps 2, num_stages 1, tiles of 128 keys,
                4 tiles a program (any of the four, in any order: `parse_triton_variant`)
beside the bytes floor (the rows' K and V read once at --peak-tbps). Every variant's output is
checked against eager gathered SDPA on its own pool (max abs difference in the JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.flex_decode", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-sizes", default="1,16,64,128")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--pool-rows", type=int, default=257)
    p.add_argument("--max-seq-len", type=int, default=1480)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--peak-tbps", type=float, default=4.8)
    p.add_argument("--variants", default="sdpa,flex,flex_dynamic,flex_static")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import torch

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    rows = [{"batch_size": b, "max_abs_diff": {}} for b in sizes]
    def doc() -> dict:
        for row in rows:
            b = row["batch_size"]
            row["floor_us"] = b * (args.context + 1) * 8 * 128 * 2 * 2 / (args.peak_tbps * 1e12) * 1e6
        return {"context": args.context, "pool_rows": args.pool_rows, "max_seq_len": args.max_seq_len, "rows": rows,
                "statistic": f"median of {args.repeats} CUDA-graph replays (us)",
                "command": " ".join(["python -m dynspec.benchmarks.flex_decode", *sys.argv[1:]])}

    for name in args.variants.split(","):
        # variant by variant, every b in turn, as the engine meets them; dynamo's cache is per
        # code object (one variant could serve another's shapes), so each variant starts empty
        torch._dynamo.reset()
        for row in rows:
            row[f"{name}_us"], row["max_abs_diff"][name] = run_point(row["batch_size"], name, args)
        _write(args.out, doc())          # after each variant: a run cut short keeps what it timed
    print(json.dumps([{k: r[k] for k in r if k != "max_abs_diff"} for r in rows]))
    return 0


def _write(path: str, doc: dict) -> None:
    with open(path + ".part", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".part", path)


_pools: dict = {}


def _pool(rows: int, per_seq: int, b: int, ctx: int, bs: int, dev):
    """_make_pool's result, made once per arguments (random pools of ~600 MB take seconds on the
    host; every variant at one b reads the same one). Kept on the GPU until the process ends:
    about 0.6 GB per --batch-sizes entry at the default sizes."""
    key = (rows, per_seq, b, ctx, bs, str(dev))
    if key not in _pools:
        _pools[key] = _make_pool(rows, per_seq, b, ctx, bs, dev)
    return _pools[key]


def _make_pool(rows: int, per_seq: int, b: int, ctx: int, bs: int, dev):
    """(k, v pools [8, blocks*bs, 128], owner, logical, tables [b, per_seq], q_pos [b, 1]) with rows
    0..b-1 holding blocks spread over the pool the way an allocator hands them out."""
    import torch

    from dynspec.runtime.engines.reference.attention import uniform_batch

    blocks = 1 + rows * per_seq
    g = torch.Generator(device="cpu").manual_seed(0)
    k = torch.randn(8, blocks * bs, 128, generator=g).to(dev, torch.bfloat16)
    v = torch.randn(8, blocks * bs, 128, generator=g).to(dev, torch.bfloat16)
    order = 1 + torch.randperm(blocks - 1, generator=g)[: b * per_seq]
    tables = order.view(b, per_seq).to(dev)
    owner = torch.full((blocks,), -1, dtype=torch.long, device=dev)
    logical = torch.zeros(blocks, dtype=torch.long, device=dev)
    owner[tables] = torch.arange(b, device=dev)[:, None].expand(b, per_seq)
    logical[tables] = torch.arange(per_seq, device=dev)[None].expand(b, per_seq)
    slots = torch.arange(b, device=dev)
    q_pos = torch.full((b, 1), ctx, dtype=torch.long, device=dev)
    batch = uniform_batch(tables, slots, q_pos, per_seq, bs)
    return k, v, owner, logical, batch


def _graph_us(fn, repeats: int) -> tuple[float, object]:
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    times = []
    for _ in range(repeats):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        z.record()
        z.synchronize()
        times.append(1e3 * a.elapsed_time(z))
    return statistics.median(times), out


def run_point(b: int, name: str, args) -> tuple[float | None, float | str]:
    """(median us, max abs difference from gathered SDPA on the variant's own pool, or the error)."""
    import torch

    from dynspec.runtime.engines.reference import attention as att

    bs, dev = 128, args.device
    per_seq = -(-args.max_seq_len // bs)
    q = torch.randn(b, 32, 128, device=dev, dtype=torch.bfloat16)
    with torch.inference_mode():
        rows = b if name == "flex_small" else args.pool_rows
        k, v, owner, logical, batch = _pool(rows, per_seq, b, args.context, bs, dev)
        read = -(-(args.context + 1) // bs)
        small = att.uniform_batch(batch.tables, batch.slots, batch.q_pos, read, bs)
        ref = att.sdpa_attention(q, k, v, small).float()              # this variant's pool
        if name == "sdpa":
            fn = lambda: att.sdpa_attention(q, k, v, small)           # noqa: E731
        elif name.startswith("triton"):
            from dynspec.runtime.engines.reference.paged_decode import paged_decode_attention

            kw = parse_triton_variant(name)
            fn = lambda: paged_decode_attention(q, k, v, batch, bs, **kw)   # noqa: E731
        else:
            mask = att.paged_block_mask(batch, owner, logical, bs, k.shape[1])
            kw = {"kernel_options": {"FORCE_USE_FLEX_ATTENTION": True}} if name == "flex_main" else {}
            flex = _own_flex(name) if name in ("flex_static", "flex_dynamic") else None
            fn = lambda: att.flex_attention_paged(q, k, v, batch, owner, logical, bs, mask, flex,  # noqa: E731
                                                  static_batch=name != "flex_dynamic", **kw)
        try:
            us, o = _graph_us(fn, args.repeats)
        except Exception as e:          # a variant that does not compile is a finding, not a stop
            return None, f"{type(e).__name__}: {str(e)[:300]}"
        return us, float((o.float() - ref).abs().max())


def parse_triton_variant(name: str) -> dict:
    """'triton' -> {}; 'triton-w2-s1-t128-p4' -> {'num_warps': 2, 'num_stages': 1, 'tile': 128, 'per': 4}
    (p: tiles a program, so fewer splits to merge)."""
    keys = {"w": "num_warps", "s": "num_stages", "t": "tile", "p": "per"}
    out = {}
    for part in name.split("-")[1:]:
        if part[:1] not in keys or not part[1:].isdigit():
            raise ValueError(f"variant {name!r}: {part!r} is not w<N>, s<N>, t<N> or p<N>")
        out[keys[part[0]]] = int(part[1:])
    return out


_own: dict = {}


def _own_flex(name: str):
    """flex_attention compiled apart from the engine's: dynamic=False (flex_static) or default
    dynamic (flex_dynamic). main() resets dynamo before each variant: versions compiled for one
    compile of flex_attention's code could otherwise serve another's shapes (seen in call 9)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if name not in _own:
        _own[name] = torch.compile(flex_attention, fullgraph=True, dynamic=False if name == "flex_static" else None)
    return _own[name]


if __name__ == "__main__":
    sys.exit(main())
