"""benchmarks/numerics.py: the agreement count, and float32 agreement on the embedded pair."""
from dynspec.benchmarks.numerics import agreement, measure


def test_agreement_counts_identical_outputs_and_first_divergence():
    a = [(1, 2, 3), (4, 5), (6, 7, 8)]
    b = [(1, 2, 3), (4, 9), (6, 7)]            # the last one is a prefix: parts at its end
    assert agreement(a, b) == {"identical": 1, "of": 3, "first_divergence": [1, 2]}


def test_float32_outputs_agree_across_batch_sizes_and_draft_lengths():
    doc = measure("float32", num_prompts=4, max_new=12, concurrency=4, k=3)
    for what in ("batch", "draft", "both"):
        assert doc[what]["identical"] == 4, (what, doc[what])
