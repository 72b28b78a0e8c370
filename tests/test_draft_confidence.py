"""benchmarks/draft_confidence.py: the recorded trajectory is spec_decode's, counts add up, the
predictors are online (no peeking at later steps), the scores are in range, and the CLI writes
its JSON atomically and refuses abbreviated flags."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dynspec.benchmarks import draft_confidence as dc
from dynspec.corpus import ASSET_DIR

NEW, K = 40, 4


@pytest.fixture(scope="module")
def pair():
    from dynspec.runtime.engines.reference.load import load_draft, load_target

    torch.set_num_threads(1)
    target = load_target(Path(ASSET_DIR) / "target")
    return target, load_draft(Path(ASSET_DIR) / "draft", target), dc.check_prompts(Path(ASSET_DIR), 2)


@pytest.fixture(scope="module")
def recorded(pair):
    target, draft, prompts = pair
    return [dc.record_request(target, draft, p, NEW, K) for p in prompts], \
        [dc.chain_table(target, draft, p, NEW, K) for p in prompts]


def test_recording_is_spec_decode_and_counts_add_up(pair, recorded):
    from dynspec.pairs.decode import plain_greedy, spec_decode

    target, draft, prompts = pair
    for p, (out, acc, probs), (r, P) in zip(prompts, *recorded):
        assert (out, acc) == tuple(spec_decode(target, draft, p, NEW, K))
        assert out == plain_greedy(target, p, NEW)                       # lossless
        assert len(probs) == len(acc) and all(len(x) == K for x in probs)
        assert all(1 / 512 - 1e-6 <= x <= 1 for ps in probs for x in ps)
        assert 1 + sum(a + 1 for a in acc) >= NEW > 1 + sum(a + 1 for a in acc[:-1])   # 1: the prefill's token
        # the chain table replays to the same steps and the same probabilities
        racc, rprobs = dc.replay(r, P, NEW, K)
        assert racc == acc and np.allclose(rprobs, probs, atol=1e-4)
    rec = dc.flat_records([(acc, probs) for _, acc, probs in recorded[0]])
    n_steps = sum(len(acc) for _, acc, _ in recorded[0])
    assert len(rec["p"]) == n_steps * K
    acc_all = [a for _, acc, _ in recorded[0] for a in acc]
    tried = np.array(rec["tried"]).reshape(-1, K)
    hit = np.array(rec["accepted"]).reshape(-1, K)
    assert tried[:, 0].all() and (hit <= tried).all()
    assert hit.sum() == sum(acc_all)                                      # hits at j = accepted per step
    assert (tried[:, 1:] == hit[:, :-1]).all()                            # tried at j+1 iff hit at j


def test_online_predictions_never_see_later_steps(recorded):
    recs = [(acc, probs) for _, acc, probs in recorded[0]]
    req, acc, preds = dc.open_loop(recs, K, 8.0, 2)
    cut = len(acc) // 2
    flipped = []                                       # change every outcome from step `cut` on
    seen = 0
    for a_s, p_s in recs:
        flipped.append(([a if seen + i < cut else K - a for i, a in enumerate(a_s)], p_s))
        seen += len(a_s)
    _, acc2, preds2 = dc.open_loop(flipped, K, 8.0, 2)
    assert (acc2[cut:] != acc[cut:]).any()
    for n in dc.PREDICTORS:
        assert np.array_equal(preds[n][:cut + 1], preds2[n][:cut + 1]), n
        assert not np.array_equal(preds[n][cut + 1:], preds2[n][cut + 1:]), n      # and later ones do


def test_shrinkage_matches_the_row_table():
    from dynspec.runtime.policy.row_table import RowTable

    on, tab = dc.Online(3, w=4.0), RowTable(1, 3)
    steps = [(3, 2), (3, 0), (2, 2), (3, 3)]
    for Kd, a in steps:
        pr = on.predict([0.5, 0.5, 0.5])
        pool = (on.H + 1) / (on.T + 2)
        assert np.allclose(pr["b_shrunk"], tab.rates([0], pool, 4.0)[0])
        on.observe(pr["b_shrunk"], [0.5] * 3, Kd, a)
        tab.update([0], [Kd], [a])
    assert on.T.tolist() == tab.trials[0].tolist() and on.H.tolist() == tab.hits[0].tolist()


def test_fitters():
    rng = np.random.default_rng(0)
    x = rng.normal(size=4000)
    y = (rng.random(4000) < dc.sigmoid(0.5 + 2.0 * x)).astype(float)
    w = dc.fit_logistic(np.stack([np.ones_like(x), x], 1), y, [0.0, 0.0])
    assert abs(w[0] - 0.5) < 0.15 and abs(w[1] - 2.0) < 0.25
    iso = dc.pav([0.2, 0.1, 0.5, 0.4, 0.9], [1, 1, 1, 3, 1])
    assert np.all(np.diff(iso) >= 0) and np.allclose(iso, [0.15, 0.15, 0.425, 0.425, 0.9])


def test_scores_and_allocations_are_in_range(recorded):
    res = dc.evaluate([(acc, probs) for _, acc, probs in recorded[0]], recorded[1], NEW, K, refit=2)
    ol, cl = res["open_loop"], res["closed_loop"]
    acc = np.array([a for _, a_s, _ in recorded[0] for a in a_s])
    assert res["steps"] == len(acc)
    assert ol["uniform"][f"K={K}"]["tokens_per_step"] == pytest.approx(acc.mean() + 1)
    assert cl["uniform"][f"K={K}"]["tokens_per_step"] == pytest.approx(acc.mean() + 1)
    assert cl["uniform"]["K=0"]["tokens_per_step"] == 1.0
    for n in dc.PREDICTORS:
        s = ol[n]
        assert s["n"] == int((acc[:, None] >= np.arange(K)).sum())
        assert 0 <= s["brier"] <= 1 and s["log_loss"] >= 0
        assert sum(p["n"] for p in s["per_position"]) == s["n"]
        for pol, t in list(s["allocation"].items()) + list(cl[n].items()):
            assert 1 <= t["tokens_per_step"] <= K + 1 and 0 <= t["drafted_per_step"] <= K, (n, pol)
            assert 0 <= t["accepted_per_drafted"] <= 1
        for D in dc.BUDGETS:
            assert s["allocation"][f"budget_{D}"]["drafted_per_step"] == pytest.approx(
                round(D * len(acc)) / len(acc))
        # nothing beats drafting exactly what will be accepted, at fewer drafted tokens
        for t in s["allocation"].values():
            assert t["tokens_per_step"] <= ol["oracle"]["allocation"]["tokens_per_step"] + 1e-12
    lo, hi = res["bootstrap_95ci_vs_b_shrunk"]["log_loss"]["b_shrunk"]
    assert lo == hi == 0


def test_cli_writes_json_and_refuses_abbreviations(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert dc.main(["--prompts", "1", "--new", "16", "--out", str(out), "--no-progress"]) == 0
    d = json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    assert d["cross_check"]["requests_where_chain_table_replay_differs"] == 0
    assert d["command"].endswith("--out " + str(out) + " --no-progress")
    assert set(d["results"]["open_loop"]) >= set(dc.PREDICTORS)
    assert "| b_shrunk |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        dc.make_parser().parse_args(["--prom", "1", "--out", str(out)])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        dc.main(["--k", "0", "--out", str(out)])
