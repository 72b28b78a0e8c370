"""Peak host memory of rank 0 of TP=2 loading a pair: this rank's shards only (shard_part) vs
the whole pair then apply_tp. Not a test; the figure in docs/tensor_parallel.md.

    python -c 'from tests.helpers_models import *; t = make_tiny_target("/tmp/rss/t", vocab=32000, hidden=1024, \
        layers=4, heads=16, kv_heads=4, intermediate=2816); make_tiny_draft("/tmp/rss/d", t, embed=True)'
    OMP_NUM_THREADS=1 python tests/mpi/tp_load_rss.py whole|sharded /tmp/rss/t /tmp/rss/d
"""
import resource
import sys
import threading
import time
from functools import partial

import torch

from dynspec.checkpoint.hf_config import read_config
from dynspec.runtime.engines.reference import tp, tp_shard
from dynspec.runtime.engines.reference.draft import Eagle3Config
from dynspec.runtime.engines.reference.load import load_draft, load_target
from dynspec.runtime.engines.reference.model_config import TargetConfig
from dynspec.runtime.tp.tp_groups import TpContext
from dynspec.runtime.tp.tp_layout import layout


def anon_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def main(mode: str, t_dir: str, d_dir: str) -> None:
    base, anon0, high, done = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, anon_kib(), [0], threading.Event()

    def sample():                        # the highest anonymous RSS, every 0.5 ms
        while not done.is_set():
            high[0] = max(high[0], anon_kib())
            time.sleep(0.0005)
    threading.Thread(target=sample, daemon=True).start()
    ctx = TpContext(layout(0, 2, 2), torch.device("cpu"), 1.0)
    if mode == "sharded":
        tc = TargetConfig.from_hf(read_config(t_dir), "target")
        ts, ds = tp_shard.check_tp(tc, Eagle3Config.from_hf(read_config(d_dir), "draft", tc), 2)
        t = load_target(t_dir, part=partial(tp_shard.shard_part, s=ts, rank=0))
        d = load_draft(d_dir, t, part=partial(tp_shard.shard_part, s=ds, rank=0))
        tp.apply_tp(t, d, ctx, loaded=True)
    else:
        t = load_target(t_dir)
        d = load_draft(d_dir, t)
        tp.apply_tp(t, d, ctx)
    done.set()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{mode}: peak RSS +{(peak - base) / 1024:.0f} MiB over imports, "
          f"peak RssAnon +{(high[0] - anon0) / 1024:.0f} MiB")


if __name__ == "__main__":
    main(*sys.argv[1:4])
