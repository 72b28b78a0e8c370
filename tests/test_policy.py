"""DraftSchedule: lookups at every tier boundary, dialect renderings checked against each
TRT-LLM version's own lookup rule (written out independently here, from docs/design.md), bounds,
and the `dynspec schedule` CLI including its error exits. vLLM: tests/test_vllm_schedule.py."""
import bisect
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynspec.cli import main
from dynspec.runtime.policy import MAX_BATCH_SIZE, MAX_DRAFT_LEN, DraftSchedule, ScheduleError
from dynspec.runtime.policy.schedule_trtllm import trtllm_dialect
from tests.test_vllm_schedule import vllm_dense_lookup


# ---- independent oracles: how each TRT-LLM version reads `draft_len_schedule` ------------
def trtllm_12_lookup(d: dict, b: int) -> int:
    """1.2.x: keys are lower bounds; the largest key <= b wins (bisect_right)."""
    keys = sorted(int(k) for k in d)
    assert keys[0] == 1, "1.2.x needs key 1"
    i = bisect.bisect_right(keys, b) - 1
    return d[keys[i]]


def trtllm_13_lookup(d: dict, b: int) -> int:
    """1.3.x: keys are upper bounds; the smallest key >= b wins (bisect_left); 0 above."""
    keys = sorted(int(k) for k in d)
    i = bisect.bisect_left(keys, b)
    return d[keys[i]] if i < len(keys) else 0


# ---- table tests ----------------------------------------------------------------------------
S = DraftSchedule.parse("4:4,8:2,32:1")


@pytest.mark.parametrize("b,k", [(1, 4), (4, 4), (5, 2), (8, 2), (9, 1), (32, 1), (33, 0), (10_000, 0)])
def test_lookup_at_every_boundary(b, k):
    assert S.draft_len(b) == k
    assert S(b) == k


def test_threshold_is_the_field_fallback():
    s = DraftSchedule.threshold(max_draft_len=4, disable_above=5)
    assert [s.draft_len(b) for b in range(1, 8)] == [4, 4, 4, 4, 4, 0, 0]
    assert s.to_trtllm("1.2.1") == {1: 4, 6: 0}
    assert s.to_trtllm("1.3.0") == {5: 4}


def test_renderings_of_the_documented_example():
    assert S.to_trtllm("1.2.1") == {1: 4, 5: 2, 9: 1, 33: 0}
    assert S.to_trtllm("1.3.0rc2") == {4: 4, 8: 2, 32: 1}
    assert S.to_vllm() == [[1, 4, 4], [5, 8, 2], [9, 32, 1], [33, MAX_BATCH_SIZE, 0]]
    assert DraftSchedule.from_vllm(S.to_vllm(), 4) == S
    assert S.to_spec() == "4:4,8:2,32:1"
    assert S.max_draft_len == 4
    assert S.reachable(64) == (4, 2, 1, 0)
    assert S.reachable(3) == (4,)


def test_canonical_form_merges_equal_neighbours_and_trailing_zeros():
    assert DraftSchedule(((2, 4), (4, 4), (8, 0))) == DraftSchedule(((4, 4),))
    assert DraftSchedule.parse("") == DraftSchedule()
    assert DraftSchedule().draft_len(1) == 0


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("4:2,8:3", "increases"),
        ("0:4", "below 1"),
        ("4:4,4:2", "duplicate"),
        ("4:-1", "negative"),
        ("4:4,x", "cannot parse"),
        ("8:4,4:2", "not above"),
    ],
)
def test_bad_specs_name_the_value(spec, needle):
    with pytest.raises(ScheduleError, match=needle):
        DraftSchedule.parse(spec)


def test_k_above_max_draft_len_is_named():
    with pytest.raises(ScheduleError, match="exceeds max_draft_len=3"):
        DraftSchedule.parse("4:4", max_draft_len=3)


@pytest.mark.parametrize("spec,needle", [
    ("4:1000000", "K=1000000 exceeds the limit 32"),
    (f"4:{MAX_DRAFT_LEN + 1}", f"K={MAX_DRAFT_LEN + 1} exceeds the limit"),
    (f"{MAX_BATCH_SIZE + 1}:4", f"bound {MAX_BATCH_SIZE + 1} exceeds the limit"),
    ("4:" + "9" * 13, "at most 12"),
    ("9" * 5000 + ":4", "at most 12"),                 # no int() of a 5000-digit string
    ("\uff14:4", "cannot parse"),                      # fullwidth 4: str.isdigit() says True
    ("4:\u0664", "cannot parse"),                      # Arabic-Indic 4
    ("\U0001d7dc:4", "cannot parse"),                  # mathematical double-struck 4
])
def test_bounds_and_ascii_digits(spec, needle):
    assert any(c.isdigit() for c in spec)
    with pytest.raises(ScheduleError, match=needle):
        DraftSchedule.parse(spec)


def test_limits_themselves_are_accepted():
    s = DraftSchedule.parse(f"{MAX_BATCH_SIZE}:{MAX_DRAFT_LEN}")
    assert s.draft_len(MAX_BATCH_SIZE) == MAX_DRAFT_LEN and s.to_vllm() == [[1, MAX_BATCH_SIZE, MAX_DRAFT_LEN]]
    assert DraftSchedule.parse(" 4 : 4 ,\t8:2") == DraftSchedule.parse("4:4,8:2")
    with pytest.raises(ScheduleError, match="exceeds the limit"):
        DraftSchedule(((4, MAX_DRAFT_LEN + 1),))
    with pytest.raises(ScheduleError, match="exceeds the limit"):
        DraftSchedule.threshold(MAX_DRAFT_LEN + 1, 4)


@pytest.mark.parametrize("version", ["\uff11.2.1", "1.\uff12.1", "1.2.\u0661", "1.2.1\n", "1.2.1 ", " 1.2.1", "1.2.1\x00",
                                     "1.2.1rc\u0661", None, 1.2])
def test_versions_are_ascii_and_exact(version):
    with pytest.raises(ScheduleError, match="unparseable TensorRT-LLM version"):
        trtllm_dialect(version)


def test_reachable_and_ranges_are_per_tier():
    assert S.ranges(40) == ((1, 4, 4), (5, 8, 2), (9, 32, 1), (33, 40, 0))
    assert S.ranges(6) == ((1, 4, 4), (5, 6, 2))
    assert S.reachable(MAX_BATCH_SIZE) == (4, 2, 1, 0)
    assert DraftSchedule().ranges(3) == ((1, 3, 0),)
    for bad in (0, -1, MAX_BATCH_SIZE + 1):
        with pytest.raises(ScheduleError, match=f"max batch size {bad} is outside"):
            S.ranges(bad)


def test_unknown_versions_are_errors_not_guesses():
    for v in ("1.1.0", "2.0.0", "latest", "1"):
        with pytest.raises(ScheduleError, match=repr(v)):
            trtllm_dialect(v)
    assert trtllm_dialect("1.2.1") == "lower"
    assert trtllm_dialect("1.3.0") == "upper"


def test_empty_schedule_cannot_render_for_trtllm():
    with pytest.raises(ScheduleError, match="never speculates"):
        DraftSchedule().to_trtllm("1.2.1")


def test_from_trtllm_rejects_malformed_dicts():
    for bad in ({"\uff11": 4, "5": 0}, {"1": "\uff14", "5": 0}, {"1": 4.0, "5": 0}, {True: 4, 5: 0}, {"1 ": 4, "5": 0}):
        with pytest.raises(ScheduleError, match="not an integer"):
            DraftSchedule.from_trtllm(bad, "1.2.1")
    assert DraftSchedule.from_trtllm({"1": 4, "5": 0}, "1.2.1") == DraftSchedule.parse("4:4")
    with pytest.raises(ScheduleError, match="needs key 1"):
        DraftSchedule.from_trtllm({2: 4, 9: 0}, "1.2.1")
    with pytest.raises(ScheduleError, match="explicit 0"):
        DraftSchedule.from_trtllm({1: 4, 9: 2}, "1.2.1")
    with pytest.raises(ScheduleError, match="increases"):
        DraftSchedule.from_trtllm({4: 2, 8: 3}, "1.3.0")


# ---- property test: every dialect, every batch size --------------------------------------
@st.composite
def schedules(draw):
    n = draw(st.integers(1, 6))
    bounds = sorted(draw(st.sets(st.integers(1, 400), min_size=n, max_size=n)))
    ks = sorted(draw(st.lists(st.integers(1, 16), min_size=n, max_size=n)), reverse=True)
    return DraftSchedule(tuple(zip(bounds, ks)))


@settings(max_examples=150, deadline=None)
@given(schedules(), st.sampled_from(["1.2.0", "1.2.1", "1.3.0", "1.3.0rc3"]))
def test_rendered_dict_read_by_the_versions_own_rule_equals_draft_len(s, version):
    d = s.to_trtllm(version)
    lookup = trtllm_12_lookup if version.startswith("1.2") else trtllm_13_lookup
    if version.startswith("1.2"):
        assert d[1] == s.max_draft_len
    else:
        assert d[min(d)] == s.max_draft_len
    ks = [d[k] for k in sorted(d)]
    assert ks == sorted(ks, reverse=True)
    vllm = vllm_dense_lookup(s.to_vllm(), 512, s.max_draft_len)
    for b in range(1, 513):
        assert lookup(d, b) == s.draft_len(b) == vllm[b]
    assert DraftSchedule.from_trtllm(d, version) == s
    assert DraftSchedule.from_trtllm({str(k): v for k, v in d.items()}, version) == s
    assert DraftSchedule.parse(s.to_spec()) == s


# ---- CLI ------------------------------------------------------------------------------------
def test_cli_json_is_exactly_one_object(capsys):
    assert main(["schedule", "--spec", "4:4,8:2,32:1", "--json", "--max-batch-size", "40"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["tiers"] == [[4, 4], [8, 2], [32, 1]]
    assert obj["trtllm_version"] == "1.2.1"
    assert obj["trtllm"] == {"1": 4, "5": 2, "9": 1, "33": 0}
    assert obj["draft_len_by_batch_range"] == [[1, 4, 4], [5, 8, 2], [9, 32, 1], [33, 40, 0]]
    assert obj["vllm"] == [[1, 4, 4], [5, 8, 2], [9, 32, 1], [33, MAX_BATCH_SIZE, 0]]


@pytest.mark.parametrize("max_bs", [1, 3, 4, 5, 31, 32, 33, 1000])
def test_cli_ranges_cover_every_batch_size_once(capsys, max_bs):
    assert main(["schedule", "--spec", "4:4,8:2,32:1", "--json", "--max-batch-size", str(max_bs)]) == 0
    runs = json.loads(capsys.readouterr().out)["draft_len_by_batch_range"]
    flat = [k for first, last, k in runs for _ in range(first, last + 1)]
    assert flat == [S.draft_len(b) for b in range(1, max_bs + 1)]


def test_cli_huge_max_batch_size_works_in_tiers():
    """The output is O(tiers), not a dict entry per batch size (100M of those are 1.4 GB), so the
    peak RSS is that of a 256-size run (imports included in both) within a few MB."""
    def peak_kib(max_bs: int) -> tuple[int, dict]:
        code = ("import resource, sys; from dynspec.cli import main; "
                f"rc = main(['schedule', '--spec', '4:4', '--json', '--max-batch-size', '{max_bs}']); "
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stderr.strip().splitlines()[-1]), json.loads(proc.stdout)

    small, _ = peak_kib(256)
    big, obj = peak_kib(100_000_000)
    assert obj["draft_len_by_batch_range"] == [[1, 4, 4], [5, 100_000_000, 0]]
    assert big - small < 20_000, (small, big)                        # KiB


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["schedule", "--spec", "4:2,8:3"], "increases"),
        (["schedule", "--threshold", "5"], "--max-draft-len"),
        (["schedule", "--spec", "4:4", "--trtllm-version", "0.9"], "no known draft_len_schedule dialect"),
        (["schedule", "--spec", "4:4", "--threshold", "3", "--max-draft-len", "2"], "not both"),
        (["schedule"], "--schedule SPEC"),
        (["schedule", "--spec", "4:1000000"], f"K=1000000 exceeds the limit {MAX_DRAFT_LEN}"),
        (["schedule", "--threshold", "4", "--max-draft-len", "99"], "--max-draft-len 99 is outside 1..32"),
        (["schedule", "--spec", "\uff14:4"], "cannot parse schedule tier '\uff14:4'"),
        (["schedule", "--spec", "4:\u0664"], "cannot parse"),
        (["schedule", "--spec", "4:4", "--trtllm-version", "\uff11.2.1"], "unparseable TensorRT-LLM version"),
        (["schedule", "--spec", "4:4", "--trtllm-version", "1.2.1\n"], "'1.2.1\\n'"),
        (["schedule", "--spec", "4:4", "--max-batch-size", "0"], "--max-batch-size 0 is outside"),
        (["schedule", "--spec", "4:4", "--max-batch-size", "-5"], "--max-batch-size -5 is outside"),
        (["schedule", "--spec", "4:4", "--max-batch-size", str(2**31)], "is outside 1..2147483647"),
        (["schedule", "--spec", "4:4", "--max-draft-len=-3"], "--max-draft-len -3 is outside 1..32"),
        (["schedule", "--threshold", "4", "--max-draft-len", "0"], "--max-draft-len 0 is outside"),
        (["schedule", "--threshold", "0", "--max-draft-len", "4"], "disable_above=0"),
        (["schedule", "--spec", "4:4", "--json", "--trtllm-version", "1.2.1"], None),
    ],
)
def test_cli_errors_exit_2_with_one_line(argv, needle):
    proc = subprocess.run([sys.executable, "-m", "dynspec.cli", *argv], capture_output=True, text=True)
    if needle is None:                        # the control row: the same flags, valid, succeed
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        return
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_our_build_folder_does_not_shadow_pypa_build(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import build, dynspec.build; print(build.__file__)"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "site-packages" in proc.stdout and "dynspec" not in proc.stdout.split("site-packages")[-1]


# ---- the Policy protocol -------------------------------------------------------------------------
def test_every_policy_class_is_a_policy():
    """DraftSchedule (parsed, static, threshold, empty), ConstantK and AdaptivePolicy answer the
    protocol's questions (runtime/policy/__init__.py's table); a bare callable does not."""
    from dynspec.runtime.policy.adaptive import AdaptivePolicy
    from dynspec.runtime.policy import ConstantK, Policy, speculates
    from tests.test_adaptive_lossless import linear_cost

    table = [  # policy, max_draft_len, drafts, choices at b=6, chooses_keep_warm
        (DraftSchedule.parse("4:4,8:2"), 4, True, (0, 2), False),
        (DraftSchedule.static(3, 4), 3, True, (0,), False),
        (DraftSchedule.threshold(5, 8), 5, True, (0, 5), False),
        (DraftSchedule(), 0, False, (0,), False),
        (ConstantK(0), 0, True, (0,), False),
        (ConstantK(3), 3, True, (3,), False),
        (AdaptivePolicy(linear_cost(kmax=3)), 3, True, (0, 1, 2, 3), True),
    ]
    for policy, kmax, drafts, choices, warm in table:
        assert isinstance(policy, Policy), policy
        assert (policy.max_draft_len, policy.drafts, policy.choices(6), policy.chooses_keep_warm) == (
            kmax, drafts, choices, warm), policy
        assert speculates(policy) is drafts
        if not warm:                                   # a schedule-like policy: K = policy(b), its largest choice
            assert policy(6) == max(choices)
    assert not isinstance(lambda b: 0, Policy)
    with pytest.raises(ScheduleError, match="outside 0..32"):
        ConstantK(MAX_DRAFT_LEN + 1)


def test_a_schedule_counts_the_prompts_whose_prefill_the_step_ends():
    """At C = 64 a prompt joins when a row ends: its last chunk rides with 63 rows. It emits its first
    token in that step, so "63:2,200:1" runs K=1 there, as at 64 rows; a prompt that does not end in
    the step (more tokens than the budget leaves) is not counted, nor is any without a tier to lower."""
    from dynspec.runtime.policy.step_decision import StepInputs

    sched = DraftSchedule.parse("63:2,200:1")
    x = lambda b, waiting: StepInputs(b, 100.0, (0.5, 0.5), waiting=waiting, token_budget=8192)   # noqa: E731
    assert sched.decide(x(63, ())).ks == (2,) * 63
    assert sched.decide(x(63, (120,))).ks == (1,) * 63
    assert sched.decide(x(63, (9000,))).ks == (2,) * 63
    assert sched.decide(x(62, (100, 100))).ks == (1,) * 62 and sched.decide(x(61, (100, 100))).ks == (2,) * 61
    assert sched.decide(x(199, (100,))).ks == (1,) * 199 and sched.decide(x(200, (100,))).ks == (0,) * 200
    assert sched.reads_prompts and not DraftSchedule().reads_prompts
    assert sched.choices(63) == (0, 1, 2) and sched.choices(64) == (0, 1)
