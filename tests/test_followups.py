"""Small fixes: pair folders follow the umask, prompt files refuse booleans, the executor's
stats log has a bounded default footprint."""
import os
import stat
import tracemalloc

import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.driver import read_prompts
from dynspec.runtime.executor import Executor, IterationStats
from dynspec.runtime.policy import DraftSchedule


def test_random_pair_follows_umask_077(tmp_path):
    from dynspec.pairs.random_pair import write_random_pair

    old = os.umask(0o077)
    try:
        pair = write_random_pair(tmp_path / "pair", preset="tiny", seed=1)
    finally:
        os.umask(old)
    root = pair.target.parent
    paths = [root, *root.rglob("*")]
    files = [p for p in paths if p.is_file()]
    assert files and any(p.suffix == ".safetensors" for p in files)
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
    assert {stat.S_IMODE(p.stat().st_mode) for p in paths if p.is_dir()} == {0o700}


@pytest.mark.parametrize("value", ["true", "false"])
def test_read_prompts_refuses_boolean_token_ids(tmp_path, value):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "input_ids": [3, 4]}\n' f'{{"id": "b", "input_ids": [5, {value}, 6]}}\n')
    with pytest.raises(DynspecError) as e:
        read_prompts(f, None)
    assert str(e.value) == (f"{f}:2: field 'input_ids' holds {value} at index 1; "
                            "token ids are integers, not booleans")


def test_read_prompts_keeps_integer_ids(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "input_ids": [0, 1, 7]}\n')
    assert [(p.id, p.input_ids) for p in read_prompts(f, None)] == [("a", (0, 1, 7))]


def test_default_stats_log_stays_small():
    """A full default log must fit in 32 MiB: measured per-entry cost x the default bound."""
    ex = Executor(None, DraftSchedule.static(2, 4))      # the engine is not touched before submit
    n = 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = [IterationStats(i, 64, 3, 192, 100 + i % 7, 150 + i, 0.01 * i + 1e-3, 1e-4 * i + 1e-5, 64, i % 300)
                for i in range(n)]
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert len(held) == n and 100 < per_entry < 1000
    assert ex._stats.maxlen is not None
    assert ex._stats.maxlen * per_entry < 32 << 20
    assert ex._stats.maxlen >= 4096                      # the served monitor's window (serving.STATS_KEPT)


def test_generate_report_leaves_prompt_only_iterations_out_of_k_per_batch():
    """An iteration that only carried prompt chunks (b=0) chose no K; the report must not show b=0."""
    from dynspec.runtime.cli import summarize
    from dynspec.runtime.executor import IterationStats, RequestResult

    stats = [IterationStats(0, 0, 0, 0, 0, 0, 0.01, 0.0, decode_rows=0, prefill_tokens=9),
             IterationStats(1, 2, 4, 8, 5, 7, 0.01, 0.0, decode_rows=2, prefill_tokens=0)]
    results = [RequestResult(0, 5, (1, 2, 3), "length", 0.0, 0.1, 0.5)]
    assert summarize(stats, results)["k_by_batch_size"] == {2: [4]}
