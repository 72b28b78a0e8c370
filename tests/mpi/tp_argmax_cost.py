"""What the lm_head's two vocab-parallel options cost, for docs/tensor_parallel.md:

    mpirun -n 2 --oversubscribe -x OMP_NUM_THREADS=1 python tests/mpi/tp_argmax_cost.py

Llama-3 vocabulary (128256), 320 rows (b=64 decode rows x K+1=5 verify tokens), float32 logits:
all-gather the logits shards then argmax, against each rank's (max, index) gathered.
"""
import time

import torch

from dynspec.runtime.engines.reference.tp import vocab_parallel_argmax
from dynspec.runtime.tp.tp_groups import init_tp
from dynspec.runtime.tp.tp_layout import log

VOCAB, ROWS, REPEATS = 128256, 320, 5


def seconds(ctx, fn) -> float:
    fn()
    ctx.barrier()
    t0 = time.perf_counter()
    for _ in range(REPEATS):
        fn()
    return (time.perf_counter() - t0) / REPEATS


def main() -> None:
    ctx = init_tp(2)
    local = torch.randn(ROWS, VOCAB // ctx.tp, generator=torch.Generator().manual_seed(ctx.tp_rank))
    gather = seconds(ctx, lambda: ctx.all_gather(local, dim=-1).argmax(-1))
    reduce = seconds(ctx, lambda: vocab_parallel_argmax(local, VOCAB, ctx))
    same = torch.equal(ctx.all_gather(local, dim=-1).argmax(-1), vocab_parallel_argmax(local, VOCAB, ctx))
    log(f"V={VOCAB} rows={ROWS} TP={ctx.tp} gloo: all-gather logits + argmax {gather * 1e3:.1f} ms, "
        f"vocab-parallel argmax {reduce * 1e3:.1f} ms, same ids: {same}")


if __name__ == "__main__":
    main()
