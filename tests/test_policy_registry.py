"""One policy protocol: every policy answers decide(StepInputs) -> StepDecision, the executor's K
decision has one path, and runtime/policy/__init__.py POLICIES names every policy for the command line,
engine.json and the benchmarks' labels."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.policy import POLICIES, SERVED_POLICIES, ConstantK, DraftSchedule, registered_name
from dynspec.runtime.policy.step_decision import StepDecision, StepInputs
from tests.test_per_request import linear_split_cost

ENGINE = SimpleNamespace(max_draft_len=4, max_num_tokens=64, max_batch_size=8, packs_rows=True, packs_rows_alone=True, buckets=(1, 2, 4, 8))


def rows(n: int):
    from dynspec.runtime.serving.requests import Request

    return [Request(i, (1, 2), 8, frozenset(), 0.0, slot=i) for i in range(n)]


def test_the_registry_names_every_policy_once_with_what_it_reads():
    from dynspec.benchmarks.sweep_modes import COST_MODES
    from dynspec.config import POLICIES as ENGINE_JSON

    assert list(POLICIES) == ["schedule", "adaptive", "per-request", "per-request-oracle"]
    assert COST_MODES == ("adaptive", "per-request", "per-request-oracle")
    assert SERVED_POLICIES == ENGINE_JSON == ("schedule", "adaptive", "per-request")
    assert [n for n, p in POLICIES.items() if p.benchmark_only] == ["per-request-oracle"]
    with pytest.raises(DynspecError, match="reads no cost model"):
        POLICIES["schedule"].make(linear_split_cost())


@pytest.mark.parametrize("name", ["adaptive", "per-request", "per-request-oracle"])
def test_a_cost_model_policy_is_made_and_labelled_by_its_name(name):
    from dynspec.benchmarks.sweep_modes import policy_label
    from dynspec.runtime.serving.driver import describe_policy

    policy = POLICIES[name].make(linear_split_cost(), max_draft_len=3, cap=DraftSchedule.parse("8:3"))
    assert registered_name(policy) == policy_label(policy) == name
    assert policy.max_draft_len == 3
    assert describe_policy(policy, "c.json") == f"{name} (cost model c.json, K 0..3)"


def test_a_schedule_is_labelled_by_its_spec_and_an_unregistered_policy_is_refused():
    from dynspec.benchmarks.sweep_modes import policy_label

    assert registered_name(DraftSchedule.parse("4:4")) == "schedule"
    assert policy_label(DraftSchedule.parse("24:3,179:1")) == "24:3,179:1"
    with pytest.raises(DynspecError, match="ConstantK is not a registered policy"):
        registered_name(ConstantK(2))


def test_a_schedule_and_a_constant_k_give_every_row_one_k():
    x = StepInputs(6, 100.0, (0.5,) * 4, keep_warm=False)
    assert DraftSchedule.parse("4:4,8:2").decide(x) == StepDecision((2,) * 6, False)
    d = ConstantK(3).decide(x)
    assert (d.ks, d.k, d.probe, d.policy, d.gain, d.predicted_ms) == ((3,) * 6, 3, False, "schedule", None, None)
    assert StepDecision((4, 1), True).capped(3).ks == (3, 1)


def test_the_adaptive_decision_is_its_rule_for_every_row():
    from dynspec.runtime.policy.adaptive import AdaptivePolicy, AdaptiveSettings

    policy = AdaptivePolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))
    for rate, since in ((0.9, 0), (0.02, 0), (0.02, 10 ** 6)):
        x = StepInputs(4, 100.0, (rate,) * 4, since_spec=since, max_k=4, bucket=4)
        d, rule = policy.decide(x), policy.choose(x)
        assert d.ks == (rule.k,) * 4 and d.policy == "adaptive" and d.probe == rule.probe
        assert (d.keep_warm, d.gain, d.predicted_ms, d.reason) == (rule.keep_warm, rule.gain, rule.predicted_ms,
                                                                    rule.reason)


def test_the_executor_hands_a_row_policy_its_rows_and_its_batch_fallback_the_same_step():
    """KDecider builds one StepInputs: the per-request policy decides on it exactly as its row rule
    does on the RowInputs made of it."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.per_request import PerRequestPolicy, RowInputs
    from dynspec.runtime.serving.planning import KDecider

    policy = PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))
    k = KDecider(ENGINE, policy, True)
    rs = rows(4)
    x = k.inputs(rs, [100, 100, 100, 100], (0.8,) * 4)
    assert x.rates.shape == (4, 4) and list(x.idle) == [0] * 4 and x.packed and x.bucket == 4
    want = policy.decide_rows(RowInputs(4, 100.0, (0.8,) * 4, x.rates, x.idle, x.max_k, True, 0, (), x.row_probes,
                                        True, x))
    kk, d, context, scale = k.decide(rs, [100, 100, 100, 100], (0.8,) * 4)
    assert d == want and kk == d.k and context == 100.0 and scale == () and d.policy == "per-request"


def test_rows_are_packed_where_the_engine_packs_them_in_this_step():
    """A per-row vector runs packed on CUDA only in a step that carries a prompt chunk (without one it
    runs the decode graph at max K_i: Engine.packs_rows_alone False), so a per-row policy is told
    packed there only; on CPU the reference engine packs every step."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.per_request import PerRequestPolicy
    from dynspec.runtime.serving.planning import KDecider

    policy = PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))
    cuda = SimpleNamespace(**{**vars(ENGINE), "packs_rows_alone": False})
    for engine, waiting, packed in ((cuda, (), False), (cuda, (40,), True), (ENGINE, (), True),
                                    (SimpleNamespace(**{**vars(ENGINE), "packs_rows": False}), (40,), False)):
        x = KDecider(engine, policy, True).inputs(rows(4), [100] * 4, (0.8,) * 4, waiting)
        assert x.packed is packed, (engine, waiting)


def test_a_new_policy_is_one_class_the_executor_runs_without_knowing_it():
    """Any object with decide() runs through the one path: K above the engine's max_draft_len is
    refused, K above the token budget capped, the row hook gets each row's counts."""
    from dynspec.runtime.serving.planning import KDecider

    class Fixed:
        max_draft_len, drafts, chooses_keep_warm = 4, True, False

        def __init__(self, ks):
            self.ks = ks

        def choices(self, b):
            return (0, 4)

        def decide(self, x):
            return StepDecision(self.ks[: x.batch_size], x.keep_warm, reason="fixed", policy="fixed")

    k = KDecider(ENGINE, Fixed((4, 4, 4, 4, 4, 4, 4, 4)), True)
    assert k.estimate is None and k.calibration is None and k.row_rates is None
    kk, d, _, _ = k.decide(rows(8), [10] * 8, (0.5,) * 4)     # 8 rows x (K + 1) <= 64: K <= 7
    assert kk == 4 and d.policy == "fixed"
    engine = SimpleNamespace(**{**vars(ENGINE), "max_num_tokens": 24})
    kk, d, _, _ = KDecider(engine, Fixed((4,) * 8), True).decide(rows(8), [10] * 8, (0.5,) * 4)
    assert kk == 2 and d.ks == (2,) * 8                      # 8 x 3 = 24 tokens
    with pytest.raises(DynspecError, match=r"policy gave K \[5, 1\] for 2 rows; the engine supports 0..4"):
        KDecider(ENGINE, Fixed((5, 1)), True).decide(rows(2), [10, 10], (0.5,) * 4)

    class Rows(Fixed):
        def row_rates(self, table, slots, pool, keys, truth):
            return np.full((len(slots), 4), 0.25)

    k = KDecider(ENGINE, Rows((2, 0)), True)
    rs = rows(2)
    k.decide(rs, [10, 10], (0.5,) * 4)
    x = k.inputs(rs, [10, 10], (0.5,) * 4)
    assert x.rates.shape == (2, 4) and list(x.idle) == [0, 1]


def test_runtime_imports_no_benchmark_module_for_its_policies():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "runtime"
    for name in ("policy/__init__.py", "policy/step_decision.py", "serving/planning.py", "policy/adaptive.py",
                 "policy/per_request.py", "policy/per_request_oracle.py", "serving/requests.py",
                 "generate/session.py", "serving/driver.py", "generate/generate_setup.py"):
        tree = ast.parse((root / name).read_text())
        mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not [m for m in mods if m.startswith("dynspec.benchmarks")], name
