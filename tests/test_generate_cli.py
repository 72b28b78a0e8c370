"""`dynspec generate`'s inputs and report: a prompt file's token ids must be integers (JSON
booleans are refused with the file, line, field and index), and the K-per-batch-size report
leaves out iterations that carried prompt chunks only (b=0 chose no K)."""
import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.driver import read_prompts


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


def test_generate_report_leaves_prompt_only_iterations_out_of_k_per_batch():
    """An iteration that only carried prompt chunks (b=0) chose no K; the report must not show b=0."""
    from dynspec.runtime.cli import summarize
    from dynspec.runtime.executor import IterationStats, RequestResult

    stats = [IterationStats(0, 0, 0, 0, 0, 0, 0.01, 0.0, decode_rows=0, prefill_tokens=9),
             IterationStats(1, 2, 4, 8, 5, 7, 0.01, 0.0, decode_rows=2, prefill_tokens=0)]
    results = [RequestResult(0, 5, (1, 2, 3), "length", 0.0, 0.1, 0.5)]
    assert summarize(stats, results)["k_by_batch_size"] == {2: [4]}
