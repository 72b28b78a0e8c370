"""The reference engine's slot state (block_tables, block_owner, block_logical, slot_key, slot_p)
follows reserve / release through one flush at the next launch (SlotState.flush): reserve and
release touch the host's bookkeeping only, and the flush writes what the immediate per-request
writes would have left, in one host -> device copy and a fixed number of kernels however many
requests came and went. CPU, the tiny pair, float64."""
from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dynspec.runtime.engines.reference.slot_state as engine_mod
from dynspec.runtime.policy.acceptance import BernoulliMix, Greedy, Shift, rate_of
from dynspec.runtime.serving.driver import run_closed_loop
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.engines.reference.kv_cache import SCRATCH_BLOCK
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.loop import Loop
from dynspec.runtime.serving.plan import make_plan
from dynspec.runtime.policy import DraftSchedule
from tests.helpers_models import make_tiny_pair

DT = torch.float64
MIX = BernoulliMix(((0.9, 0.5), (0.2, 0.5)), seed=3)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("pair"), vocab=96, hidden=32, layers=3, heads=4, kv_heads=2, seed=1,
                          draft_vocab=64, draft_seed=2)


def engine(pair, max_batch=8, max_seq=64, **cache):
    """block_size 16 on CPU: 4 blocks a table; num_blocks (cache) below 1 + 8 x 4 makes slots
    compete for blocks, so freed blocks go to other slots."""
    return load_reference_engine(*pair, dtype=DT, max_batch_size=max_batch, max_seq_len=max_seq, max_draft_len=4,
                                 **cache)


class Immediate:
    """The slot state as the per-request writes of reserve / release left it (the engine before
    the flush), replayed on host tensors from what the allocator handed out."""

    def __init__(self, eng):
        self.tables = torch.full_like(eng.slots.block_tables, SCRATCH_BLOCK)
        self.owner = torch.full_like(eng.slots.block_owner, -1)
        self.logical = torch.zeros_like(eng.slots.block_logical)
        self.key = torch.zeros_like(eng.slots.slot_key)
        self.p = torch.zeros_like(eng.slots.slot_p)
        self.keys: dict[int, int] = {}
        self.model = None

    def reserve(self, slot, table, key):
        t = torch.tensor(table, dtype=torch.long)
        self.tables[slot, :len(table)] = t
        self.owner[t] = slot
        self.logical[t] = torch.arange(len(table))
        self.key[slot] = key
        self.keys[slot] = key
        if self.model is not None:
            self.p[slot] = rate_of(self.model, key) or 0.0

    def release(self, slot, table):
        self.owner[torch.tensor(table, dtype=torch.long)] = -1
        self.tables[slot] = SCRATCH_BLOCK
        self.keys.pop(slot)

    def set_model(self, model):                     # as SlotState.set_acceptance
        self.p.zero_()
        for s, k in self.keys.items():
            self.p[s] = rate_of(model, k) or 0.0
        self.model = model


def oracle_check(eng, keys: dict[int, int], model) -> None:
    """The flushed device state against the host allocator's: every slot's table padded with the
    scratch block (released slots: the scratch row), every block's owner (or -1) and its index in
    the owner's table; a reserved slot's key and rate."""
    assert not eng.slots.dirty_slots and not eng.slots.dirty_blocks
    W, tables = eng.max_blocks_per_seq, eng.blocks.tables
    want_tables = torch.full_like(eng.slots.block_tables, SCRATCH_BLOCK)          # [slots+1, max_blocks]
    want_owner = torch.full_like(eng.slots.block_owner, -1)                       # [blocks]
    for s, table in tables.items():
        want_tables[s, :len(table)] = torch.tensor(table)
        for j, blk in enumerate(table):
            want_owner[blk] = s
            assert eng.slots.block_logical[blk].item() == j
    assert torch.equal(eng.slots.block_tables, want_tables)
    assert torch.equal(eng.slots.block_owner, want_owner)
    assert eng.slots.block_tables.shape[1] == W
    assert set(keys) == set(tables)
    for s, k in keys.items():
        assert eng.slots.slot_key[s].item() == k
        if model is not None:
            assert eng.slots.slot_p[s].item() == torch.tensor(rate_of(model, k) or 0.0, dtype=torch.float32).item()


def same_as_immediate(eng, imm: Immediate) -> None:
    """Every entry a step reads as the immediate writes left it: all tables and owners, an owned
    block's logical index, a reserved slot's key and rate. (A free block's logical index and a free
    slot's key and rate are history: the flush leaves them as the last flush did.)"""
    assert torch.equal(eng.slots.block_tables, imm.tables)
    assert torch.equal(eng.slots.block_owner, imm.owner)
    owned = imm.owner >= 0
    assert torch.equal(eng.slots.block_logical[owned], imm.logical[owned])
    live = sorted(imm.keys)
    assert torch.equal(eng.slots.slot_key[live], imm.key[live])
    assert torch.equal(eng.slots.slot_p[live], imm.p[live])


@pytest.mark.parametrize("seed", range(4))
def test_random_reserve_release_flush_to_the_allocator_state(pair, seed):
    """Random admissions (random keys and lengths) and retirements, flushed at random points, some
    model changes between: after each flush the device state is the allocator's, and equals the
    immediate writes' entry for entry."""
    rng = random.Random(seed)
    eng = engine(pair, num_blocks=14)
    imm, keys, model = Immediate(eng), {}, None
    for it in range(120):
        if rng.random() < 0.55 or not keys:
            key = rng.randrange(1 << 40)
            slot = eng.reserve(rng.randint(1, 64), key=key)
            if slot is not None:
                keys[slot] = key
                imm.reserve(slot, eng.blocks.tables[slot], key)
        else:
            slot = rng.choice(sorted(keys))
            table = eng.blocks.tables[slot]
            eng.release(slot)
            del keys[slot]
            imm.release(slot, table)
        if rng.random() < 0.08:                    # what launch does: flush, then the model
            model = rng.choice([MIX, Shift(0.8, 0.2, 1 << 39), Greedy()])
            eng.slots.flush()
            eng.slots.set_acceptance(model)
            imm.set_model(model)
        if rng.random() < 0.3:
            eng.slots.flush()
            oracle_check(eng, keys, model)
            same_as_immediate(eng, imm)
    eng.slots.flush()
    oracle_check(eng, keys, model)
    same_as_immediate(eng, imm)


def test_a_model_change_with_slots_pending(pair):
    """slots.set_acceptance before the flush (it rewrites every reserved slot's rate from the host's
    keys) and the flush after it agree: a pending slot's rate is the new model's."""
    eng = engine(pair)
    eng.slots.set_acceptance(MIX)
    a = eng.reserve(20, key=5)
    eng.slots.set_acceptance(Shift(0.8, 0.2, 6))     # through the slot_p attribute: flushes a first
    b = eng.reserve(20, key=7)
    eng.slots.flush()
    assert eng.slots.slot_p[[a, b]].tolist() == pytest.approx([0.8, 0.2])
    eng.release(a)
    c = eng.reserve(20, key=1)                  # a's slot again
    assert c == a and eng.slot_p[c].item() == pytest.approx(0.8) and eng.slot_key[c].item() == 1


def test_same_blocks_reused_before_one_flush(pair):
    """The worked example of SlotState.flush: slot 0 holds (1, 2, 3); released, and slot 0 reserved
    again on (1, 2) before the next flush: block 3 is free, 1 and 2 are slot 0's at 0 and 1."""
    eng = engine(pair)
    eng.slots.set_acceptance(MIX)
    s = eng.reserve(40, key=7)
    assert s == 0 and eng.blocks.tables[s] == (1, 2, 3)
    eng.slots.flush()
    eng.release(s)
    assert eng.reserve(20, key=9) == 0 and eng.blocks.tables[0] == (1, 2)
    assert eng.slots.block_owner[3].item() == 0                 # nothing written yet
    assert eng.block_tables[0].tolist() == [1, 2, SCRATCH_BLOCK, SCRATCH_BLOCK]   # the attribute flushes
    assert eng.slots.block_owner[[1, 2, 3]].tolist() == [0, 0, -1]
    assert eng.slots.block_logical[[1, 2]].tolist() == [0, 1]
    assert eng.slots.slot_key[0].item() == 9
    assert eng.slots.slot_p[0].item() == pytest.approx(rate_of(MIX, 9))
    oracle_check(eng, {0: 9}, MIX)


def test_released_and_reserved_again_with_no_flush_between(pair):
    """Reserve, release, reserve again, all before the first flush: only the last counts."""
    eng = engine(pair)
    imm = Immediate(eng)
    a = eng.reserve(40, key=3)
    imm.reserve(a, eng.blocks.tables[a], 3)
    imm.release(a, eng.blocks.tables[a])
    eng.release(a)
    b = eng.reserve(64, key=4)
    imm.reserve(b, eng.blocks.tables[b], 4)
    eng.slots.flush()
    same_as_immediate(eng, imm)
    oracle_check(eng, {b: 4}, None)


def test_freed_blocks_owned_by_another_slot(pair):
    """A's blocks, freed and handed to other slots before the flush: each is owned by its new slot
    (not -1, as A's release would say if it were applied last), at its index in the new table."""
    eng = engine(pair, num_blocks=8)                       # 7 usable blocks
    a = eng.reserve(48, key=1)                            # slot 0: 3 blocks
    b = eng.reserve(64, key=2)                            # slot 1: 4 blocks, the pool is full
    eng.slots.flush()
    old = eng.blocks.tables[a]
    eng.release(a)
    c1 = eng.reserve(16, key=3)                           # slot 0 again, one of A's blocks
    c2 = eng.reserve(32, key=4)                           # a new slot, the other two
    assert c2 not in (a, b)
    eng.slots.flush()
    moved = [blk for blk in old if blk in eng.blocks.tables[c2]]
    assert len(moved) == 2
    assert eng.slots.block_owner[moved].tolist() == [c2, c2]
    assert eng.slots.block_logical[moved].tolist() == [eng.blocks.tables[c2].index(blk) for blk in moved]
    oracle_check(eng, {c1: 3, b: 2, c2: 4}, None)


def test_a_wave_costs_one_copy(pair, monkeypatch):
    """8 admissions and 5 retirements before one launch: nothing is copied at reserve / release,
    and the launch (a pure-decode step: no other copy of the engine's own) makes exactly one."""
    eng = engine(pair)
    eng.slots.set_acceptance(Greedy())                          # a model change has a copy of its own
    calls = []
    real = engine_mod.to_device

    def counting(host, device):
        calls.append(host.numel())
        return real(host, device)

    monkeypatch.setattr(engine_mod, "to_device", counting)
    slots = [eng.reserve(20, key=k) for k in range(8)]
    for s in slots[:5]:
        eng.release(s)
    assert calls == []
    live = slots[5:]
    plan = make_plan(0, positions=[3] * len(live), pending=[1] * len(live), stale=[False] * len(live),
                     keep_warm=False, buckets=eng.buckets, slots=live)
    eng.step(plan, Greedy())
    assert len(calls) == 1
    eng.step(plan, Greedy())                               # nothing changed: no copy
    assert len(calls) == 1
    oracle_check(eng, {s: k for k, s in enumerate(slots) if k >= 5}, Greedy())


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_the_flush_runs_a_fixed_number_of_ops(pair):
    """One changed slot or eight, a freed block or none: the same ops, in the same number."""
    counts = []
    for n_new, n_gone in ((1, 0), (8, 0), (3, 5)):
        eng = engine(pair)
        eng.slots.set_acceptance(MIX)
        first = [eng.reserve(20, key=k) for k in range(n_gone)]
        eng.slots.flush()
        for s in first:
            eng.release(s)
        for k in range(n_new):
            eng.reserve(20, key=100 + k)
        with OpCount() as mode:
            eng.slots.flush()
        counts.append(sorted(map(str, mode.ops)))
    assert counts[0] == counts[1] == counts[2]
    assert len(counts[0]) <= 16


def test_served_with_arrivals_and_retirements_is_lossless(pair):
    """A contended pool (blocks go from retired requests to new ones every few iterations):
    serial and overlapped speculation equal plain K=0 decode, token for token; nothing is left
    unflushed after a launch."""
    ps = [tuple(random.Random(i).randrange(96) for _ in range(3 + i % 9)) for i in range(14)]
    outs = []
    for policy, loop in ((DraftSchedule(), Loop.SERIAL), (DraftSchedule.static(3, 64), Loop.SERIAL),
                         (DraftSchedule.static(3, 64), Loop.OVERLAPPED)):
        eng = engine(pair, max_batch=4, max_seq=64, num_blocks=9)
        launch = eng.launch

        def checked(plan, acceptance, launch=launch, eng=eng):
            handle = launch(plan, acceptance)
            assert not eng.slots.dirty_slots
            return handle

        eng.launch = checked
        res = run_closed_loop(Executor(eng, policy, loop=loop), ps, 12, concurrency=4)
        outs.append([r.output_ids for r in res])
    assert outs[0] == outs[1] == outs[2]
    assert all(len(o) == 12 for o in outs[0])
