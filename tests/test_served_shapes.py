"""A served step runs at shapes the capture made: a compile inside one stalls it for 1-2 s on
the H200. The ragged kernel's compiled versions follow its launch constants, so those are checked
on CPU:
- a ragged batch's launch constants (the work-item form) depend on the model's layout alone, not
  on the number of items, tokens or rows: one version per pool layout (target, draft), which
  warm_chunks compiles before serving;
- uniform rows' constants follow the table width, so eager decode rows read the whole table, as
  the graphs do."""
import random

import pytest

from dynspec.runtime.engines.reference import ragged
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.policy import DraftSchedule
from tests.test_executor import pair  # noqa: F401  (fixture)


def test_launch_shape_worked_example():
    u = ragged.launch_shape(True, 1, 1, 4, 8, 128, 128, 16, 132)
    assert (u.splits, u.per, u.constants["BLOCK_M"], u.constants["SPLITS"]) == (32, 1, 16, 32)
    i = ragged.launch_shape(False, 2, 4, 4, 8, 128, 128, 16, 132)
    assert (i.splits, i.per, i.constants["BLOCK_M"], i.constants["SPLITS"]) == (16, 2, 16, 0)


@pytest.mark.parametrize("G,kvh,hd", [(4, 8, 128), (1, 2, 16), (8, 1, 64)])
def test_item_launches_share_one_set_of_constants(G, kvh, hd):
    """Any item count, on any SM count: the same constexprs (so the same compiled kernel)."""
    seen = {tuple(sorted(ragged.launch_shape(False, n, ragged.ITEM_TOKENS, G, kvh, hd, 128, 16, sms).constants.items()))
            for n in range(1, 400, 7) for sms in (4, 132)}
    assert len(seen) == 1, seen


def test_served_item_launches_use_the_constants_warm_chunks_made(pair, monkeypatch):  # noqa: F811
    """An engine on the Triton branch with a recorder in the kernel's place (gathered SDPA
    underneath): the constants of every item-form launch while serving arrivals at K = 0, 3 and 1
    are among those warm_chunks launched, one set per pool layout (target, draft)."""
    from dynspec.runtime.serving.driver import closed_loop
    from dynspec.runtime.engines.reference.attention import sdpa_attention

    seen: list[tuple] = []
    real_shape = ragged.launch_shape

    def shape(uniform, *a, **k):
        out = real_shape(uniform, *a, **k)
        if not uniform:
            seen.append(tuple(sorted(out.constants.items())))
        return out

    class Recorder(ragged.RaggedAttention):
        def __call__(self, q, k, v, batch):
            if batch.items is not None:           # the constants the launch would take
                shape(False, batch.items[0].shape[1], ragged.ITEM_TOKENS, q.shape[1] // k.shape[0], k.shape[0],
                      k.shape[-1], self.block_size, batch.items[1].shape[1], 132)
            return sdpa_attention(q, k, v, batch)

        def rope_attend(self, *a):
            return None

    eng = load_reference_engine(*pair, dtype="float64", max_batch_size=4, max_seq_len=128, max_draft_len=3,
                                max_num_tokens=64)
    eng.triton = True
    monkeypatch.setattr(eng, "decode_attention", lambda: Recorder(eng.block_size))
    eng.warm_chunks()
    warm = set(seen)
    assert 1 <= len(warm) <= 2                              # target and draft (one when their layouts agree)
    rng = random.Random(4)
    jobs = [(tuple(rng.randrange(96) for _ in range(rng.randint(1, 60))), rng.randint(2, 16)) for _ in range(12)]
    for policy in ("", "2:3,8:1"):
        seen.clear()
        ex = Executor(eng, DraftSchedule.parse(policy))
        closed_loop(ex, jobs, 4)
        assert seen and set(seen) <= warm
    assert any(s.decode_rows and s.prefill_tokens and s.k for s in ex.stats)


def test_eager_decode_rows_read_the_graphs_table_width_where_triton_runs(pair, monkeypatch):  # noqa: F811
    """A CPU engine on the Triton branch with a recorder in the ragged kernel's place, SDPA underneath: arrivals beside
    decode rows at K = 3 and 1 (the eager draft chain, refresh and decode rows of a mixed
    iteration) and pure decode steps. Every decode batch has the whole table's width, where the
    step's own `read` blocks would give a new (PER, SPLITS) and so a new kernel; the tokens equal
    the plain CPU engine's."""
    from dynspec.runtime.serving.driver import closed_loop
    from dynspec.runtime.engines.reference.attention import sdpa_attention

    widths = []

    def recorder(q, k, v, batch):
        if batch.items is None:                   # uniform rows (the ragged ones read the whole table)
            widths.append(batch.tables.shape[1])
        return sdpa_attention(q, k, v, batch)

    rng = random.Random(4)
    jobs = [(tuple(rng.randrange(96) for _ in range(rng.randint(3, 40))), rng.randint(2, 16)) for _ in range(12)]
    policy = DraftSchedule.parse("2:3,8:1")
    outs = []
    for triton in (False, True):
        eng = load_reference_engine(*pair, dtype="float64", max_batch_size=4, max_seq_len=128, max_draft_len=3,
                                    max_num_tokens=64)
        if triton:
            eng.triton = True
            monkeypatch.setattr(eng, "decode_attention", lambda: recorder)
        ex = Executor(eng, policy)
        outs.append([h.result().output_ids for h in closed_loop(ex, jobs, 4)])
    assert any(s.decode_rows and s.prefill_tokens and s.k for s in ex.stats)
    assert widths and set(widths) == {eng.max_blocks_per_seq}
    assert outs[0] == outs[1]
