"""The float32 greedy oracle of the GPU tests (tests/helpers_greedy.py), on CPU: equal outputs
pass, a token the reference ranks far below its own fails with its margin, a flip within the
tie tolerance of the reference's own top two logits passes as a near-tie."""
import pytest
import torch

from tests.helpers_greedy import assert_greedy_up_to_ties, greedy_margin
from tests.helpers_models import make_tiny_target

PROMPTS, LENS = [(5, 6, 7), (9, 8, 7, 6, 5)], [10, 12]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    from transformers import LlamaForCausalLM

    path = make_tiny_target(tmp_path_factory.mktemp("ties") / "target", vocab=161)
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _greedy(hf, p, n):
    ids = torch.tensor([list(p)])
    return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0, eos_token_id=None)[0, len(p):].tolist()


def _logits_after(hf, p, ref, t):
    with torch.no_grad():
        return hf(torch.tensor([list(p) + ref[:t]])).logits[0, -1].double()


def test_equal_outputs_pass_with_no_tie(hf):
    outs = [_greedy(hf, p, n) for p, n in zip(PROMPTS, LENS)]
    assert assert_greedy_up_to_ties(hf, PROMPTS, LENS, outs) == 0
    with pytest.raises(AssertionError, match="tokens, transformers gives"):
        assert_greedy_up_to_ties(hf, PROMPTS[:1], LENS[:1], [outs[0][:-1]])


def test_a_far_token_fails_and_names_its_margin(hf):
    p, n = PROMPTS[1], LENS[1]
    ref = _greedy(hf, p, n)
    logits = _logits_after(hf, p, ref, 4)
    worst = int(logits.argmin())
    bad = ref[:4] + [worst] + ref[5:]
    t, margin, scale = greedy_margin(hf, p, ref, bad)
    assert t == 4 and margin == pytest.approx(float(logits[ref[4]] - logits[worst])) and margin > 0
    with pytest.raises(AssertionError, match=f"request 0: token 4 is {worst}, transformers greedy gives {ref[4]}"):
        assert_greedy_up_to_ties(hf, [p], [n], [bad])
    assert assert_greedy_up_to_ties(hf, [p], [n], [bad], tie=float("inf")) == 1


def test_a_runner_up_within_the_tolerance_is_a_near_tie(hf):
    """At the position with the closest top two, the runner-up passes with a tolerance just
    above their gap and fails just below it."""
    p, n = PROMPTS[0], LENS[0]
    ref = _greedy(hf, p, n)
    gaps = []
    for t in range(n):
        top2 = _logits_after(hf, p, ref, t).topk(2)
        gaps.append((float(top2.values[0] - top2.values[1]), t, int(top2.indices[1])))
    gap, t, second = min(gaps)
    out = ref[:t] + [second] + [0] * (n - t - 1)          # past the tie the rows part for good
    scale = max(1.0, float(_logits_after(hf, p, ref, t).abs().max()))
    assert assert_greedy_up_to_ties(hf, [p], [n], [out], tie=gap / scale * 1.01) == 1
    with pytest.raises(AssertionError, match="beyond a near-tie"):
        assert_greedy_up_to_ties(hf, [p], [n], [out], tie=gap / scale * 0.99)
