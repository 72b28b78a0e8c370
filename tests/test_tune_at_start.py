"""The main job's schedule tuned at start (runtime/generate/tune_at_start.py): priced by served runs of the
job's own loads, prompt chunks beside decoding rows included, K > 0 only where it serves PAYS x
K=0's tok/s."""
from dynspec.runtime.generate.tune_at_start import PAYS, TUNE_WAVES, served_table, tune_prompts

ACCEPTANCE = (0.75, 0.87, 0.89, 0.88)


def schedule_of(served):
    from dynspec.runtime.policy.tune import tune

    return tune(served_table(served, ACCEPTANCE), ACCEPTANCE, 4, min_gain=PAYS).schedule


def test_each_load_is_tuned_on_two_waves_of_its_own_prompts():
    prompts = [(i,) for i in range(48)]
    assert TUNE_WAVES == 2
    assert tune_prompts(prompts, {1: 3, 16: 48}) == {1: prompts[:2], 16: prompts[:32]}
    assert tune_prompts(prompts, {16: 4}) == {16: prompts[:4]}          # never more than the job runs


def test_the_served_table_prices_an_iteration_by_the_served_tok_s():
    """At b = C, the tune rule's gain of K over K=0 is the served tok/s ratio, whatever the acceptance."""
    from dynspec.runtime.policy.tune import expected_tokens

    table = served_table({16: {0: 2000.0, 3: 2500.0}}, ACCEPTANCE)
    gain = expected_tokens(3, ACCEPTANCE) * table[16][0] / table[16][3]
    assert abs(gain - 1.25) < 1e-9
    assert abs(table[16][0] - 1e3 * 16 / 2000.0) < 1e-9                # 16 rows x 1 token at 2000 tok/s: 8 ms


def test_k_is_off_at_a_load_where_speculation_serves_less_than_pays():
    """Decode steps alone would promise ~1.3x at C=16; the served runs (mixed iterations, a draining
    batch) say K=3 serves 1.05x and K=4 0.95x: K is on at C=1 (1.3x) and off at C=16."""
    served = {1: {0: 290.0, 1: 340.0, 2: 370.0, 3: 375.0, 4: 377.0},
              16: {0: 2200.0, 1: 2250.0, 2: 2280.0, 3: 2310.0, 4: 2090.0}}
    sched = schedule_of(served)
    assert sched(1) > 0 and sched(16) == 0, sched


def test_k_stays_on_where_it_serves_pays_times_k0():
    served = {1: {0: 290.0, 1: 340.0, 2: 370.0, 3: 375.0, 4: 377.0},
              16: {0: 2000.0, 1: 2100.0, 2: 2150.0, 3: 2000.0 * (PAYS + 0.05), 4: 2000.0}}
    assert schedule_of(served)(16) == 3


def test_each_iteration_is_priced_at_the_lower_quartile_of_its_shape():
    """Trial 2 slowed every iteration of K=0 (a neighbour): 8 decode steps of 1 ms and one prompt
    batch of 10 ms per trial; the price is the quartile, not a trial's total nor one lucky step."""
    from dynspec.runtime.generate.tune_at_start import priced

    sig = [(0, 0, 1024, 0, 0)] + [(16, 0, 0, 0, 16)] * 8
    quiet = [0.010] + [0.001 + 0.0001 * i for i in range(8)]
    loud = [0.020] + [0.003] * 8
    out = priced({0: (128, [(sig, quiet), (sig, loud)])})
    decode = sorted(quiet[1:] + loud[1:])[int(0.25 * 15)]          # 0.0013
    assert abs(out[0] - 128 / (0.010 + 8 * decode)) < 1e-6
    assert priced({0: (128, [(sig, quiet), (sig, quiet)])})[0] > out[0] > 128 / sum(loud)
