"""DraftSchedule: lookups at every tier boundary, dialect renderings checked against each
TRT-LLM version's own lookup rule (written out independently here, from DESIGN.md), and the
`dynspec schedule` CLI including its error exits."""
import bisect
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynspec.cli import main
from dynspec.runtime.policy import DraftSchedule, ScheduleError, trtllm_dialect


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


def vllm_lookup(ranges, b: int) -> int:
    for start, end, k in ranges:
        if start <= b <= end:
            return k
    return 0


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
    assert S.to_vllm() == [[1, 4, 4], [5, 8, 2], [9, 32, 1]]
    assert DraftSchedule.from_vllm(S.to_vllm()) == S
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
    with pytest.raises(ScheduleError, match="needs key 1"):
        DraftSchedule.from_trtllm({2: 4, 9: 0}, "1.2.1")
    with pytest.raises(ScheduleError, match="explicit 0"):
        DraftSchedule.from_trtllm({1: 4, 9: 2}, "1.2.1")
    with pytest.raises(ScheduleError, match="increases"):
        DraftSchedule.from_trtllm({4: 2, 8: 3}, "1.3.0")


def test_vllm_ranges_must_be_contiguous():
    with pytest.raises(ScheduleError, match="expected 5"):
        DraftSchedule.from_vllm([[1, 4, 4], [6, 8, 2]])


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
    ranges = s.to_vllm()
    for b in range(1, 513):
        assert lookup(d, b) == s.draft_len(b) == vllm_lookup(ranges, b)
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
    assert len(obj["draft_len_by_batch_size"]) == 40
    assert obj["draft_len_by_batch_size"]["33"] == 0 and obj["draft_len_by_batch_size"]["9"] == 1


def test_cli_threshold_and_table(capsys):
    assert main(["schedule", "--threshold", "5", "--max-draft-len", "4", "--trtllm-version", "1.3.0"]) == 0
    out = capsys.readouterr().out
    assert "1..5" in out and "6..256" in out and '{"5": 4}' in out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["schedule", "--spec", "4:2,8:3"], "increases"),
        (["schedule", "--threshold", "5"], "--max-draft-len"),
        (["schedule", "--spec", "4:4", "--trtllm-version", "0.9"], "no known draft_len_schedule dialect"),
        (["schedule", "--spec", "4:4", "--threshold", "3", "--max-draft-len", "2"], "not both"),
        (["schedule"], "--schedule SPEC"),
    ],
)
def test_cli_errors_exit_2_with_one_line(argv, needle):
    proc = subprocess.run([sys.executable, "-m", "dynspec.cli", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_our_build_folder_does_not_shadow_pypa_build(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import build, dynspec.build; print(build.__file__)"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "site-packages" in proc.stdout and "dynspec" not in proc.stdout.split("site-packages")[-1]
