"""runtime/policy/cost_model.py: the profile.json reader (formats 1 and 2) and CostModel.lookup's worked examples."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.policy.cost_model import PROFILE_FORMAT, ContextTable, CostModel, Profile

REPO = Path(__file__).resolve().parents[1]


def table(ctx, k2):
    """b 1 and 5, K 0 and 2; k2 = (b=1, b=5) times at K=2."""
    return {"context_len": ctx, "iteration_ms": {"1": {"0": 10.0, "2": k2[0]}, "5": {"0": 11.0, "2": k2[1]}}}


def profile_doc():
    return {"format": PROFILE_FORMAT, "device": "synthetic", "context_lens": [512, 1536],
            "tables": [table(512, (12.0, 16.0)), table(1536, (14.0, 22.0))],
            "acceptance": {"per_position": [0.8, 0.6]}, "keep_warm": True}


@pytest.fixture
def model():
    return CostModel.from_profile(Profile.from_json(profile_doc()))


# ---- lookup: the module docstring's worked example ------------------------------------------------------
def test_inside_the_grid_is_bilinear_and_exact_at_profiled_points(model):
    assert model.context_lens == (512, 1536) and model.batch_sizes == (1, 5) and model.draft_lens == (0, 2)
    assert model.per_position == (0.8, 0.6)
    mid = model.lookup(3, 2, 1024)                 # 14.0 at 512, 18.0 at 1536, halfway
    assert mid.ms == pytest.approx(16.0) and not mid.extrapolated and mid.note == ""
    assert model.lookup(5, 2, 1536).ms == 22.0 and model.lookup(1, 0, 512).ms == 10.0
    assert model.lookup(2, 2, 768).ms == pytest.approx(0.75 * 13.0 + 0.25 * 16.0)   # b: 1/4, context: 1/4
    assert not model.lookup(5, 2, 512.0).extrapolated


def test_above_the_range_extends_the_last_segment_and_says_so(model):
    ctx = model.lookup(3, 2, 2560)
    assert ctx.ms == pytest.approx(22.0) and ctx.extrapolated
    assert "context 2560 above the profiled 512..1536" in ctx.note and "extended" in ctx.note
    b = model.lookup(9, 2, 512)
    assert b.ms == pytest.approx(20.0) and b.extrapolated and "b 9 above the profiled 1..5" in b.note
    both = model.lookup(9, 2, 2560)                # b extended at each context, then context extended
    assert both.ms == pytest.approx(30.0 + (30.0 - 20.0)) and "b 9" in both.note and "context 2560" in both.note


def test_below_the_range_clamps_and_says_so(model):
    low = model.lookup(3, 2, 256)
    assert low.ms == pytest.approx(14.0) and low.extrapolated and "context=512's time" in low.note
    assert model.lookup(3, 2, 0).ms == pytest.approx(14.0)


def test_a_falling_last_segment_never_predicts_below_its_end():
    doc = {"format": PROFILE_FORMAT, "context_lens": [512, 1024],
           "tables": [table(512, (14.0, 16.0)), table(1024, (13.0, 15.0))]}       # noise: faster at 1024
    m = CostModel.from_profile(Profile.from_json(doc))
    assert m.lookup(1, 2, 4096).ms == 13.0 and m.lookup(1, 2, 4096).extrapolated


def test_one_context_one_batch_size_clamps_everywhere():
    doc = {"format": PROFILE_FORMAT, "tables": [{"context_len": 1024, "iteration_ms": {"8": {"0": 5.0, "1": 6.0}}}]}
    m = CostModel.from_profile(Profile.from_json(doc))
    far = m.lookup(64, 1, 8192)
    assert far.ms == 6.0 and far.extrapolated
    assert "b 64 above the profiled 8: b=8's time" in far.note and "context 8192 above the profiled 1024" in far.note
    assert m.lookup(8, 1, 1024) == type(far)(6.0, False, "")


def test_lookup_refuses_bad_arguments(model):
    with pytest.raises(DynspecError, match=r"K=3 was not profiled \(profiled K: \[0, 2\]\)"):
        model.lookup(1, 3, 512)
    with pytest.raises(DynspecError, match="batch size 0"):
        model.lookup(0, 2, 512)
    with pytest.raises(DynspecError, match="context nan"):
        model.lookup(1, 2, float("nan"))
    with pytest.raises(DynspecError, match="context -1"):
        model.lookup(1, 2, -1)


# ---- the reader -----------------------------------------------------------------------------------------
def test_format_two_round_trips(tmp_path):
    prof = Profile.from_json(profile_doc())
    assert prof.context_lens == (512, 1536) and prof.meta == {"keep_warm": True}
    assert prof.table(1536).iteration_ms[5][2] == 22.0
    assert Profile.from_json(json.loads(json.dumps(prof.to_json()))) == prof
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof.to_json()))
    assert CostModel.load(path) == CostModel.from_profile(prof)


def test_format_one_documents_still_read(tmp_path):
    """A format-1 file (one table at the top level), written from each committed decode_floor
    profile's table: read as a profile of one context, its meta kept, rewritten as format 2."""
    files = sorted((REPO / "benchmarks" / "results" / "decode_floor").glob("floor*.json"))
    assert files, "the committed decode_floor profiles"
    for i, src in enumerate(files):
        doc = json.loads(src.read_text())
        (table,) = doc["tables"]
        raw = {"format": "dynspec-profile/1", "device": doc["device"], "context_len": table["context_len"],
               "iteration_ms": table["iteration_ms"], "decode_ms": table.get("decode_ms"), "floor": doc["floor"]}
        f = tmp_path / f"one{i}.json"
        f.write_text(json.dumps(raw))
        prof = Profile.load(f)
        assert prof.context_lens == (raw["context_len"],)
        assert prof.table().iteration_ms[1][0] == raw["iteration_ms"]["1"]["0"]
        assert prof.meta["floor"] == raw["floor"]                     # the rest is meta, kept
        m = CostModel.load(f)
        assert m.lookup(1, 0, raw["context_len"]).ms == raw["iteration_ms"]["1"]["0"]
        assert Profile.from_json(prof.to_json()) == prof             # rewritten as format 2, same content


def test_table_selection_names_the_choices():
    prof = Profile.from_json(profile_doc(), "p.json")
    with pytest.raises(DynspecError, match=r"p.json has tables at contexts \[512, 1536\]; choose one"):
        prof.table(where="p.json")
    with pytest.raises(DynspecError, match=r"no table at context 700; it has \[512, 1536\]"):
        prof.table(700)


@pytest.mark.parametrize("edit,words", [
    (lambda d: d.update(format="dynspec-profile/9"), ["p.json: field 'format'", "dynspec-profile/9"]),
    (lambda d: d.update(tables=[]), ["p.json: field 'tables' must be a non-empty list"]),
    (lambda d: d["tables"][1].pop("context_len"), ["p.json: tables[1]: missing field 'context_len'"]),
    (lambda d: d["tables"][1].update(context_len=0), ["p.json: tables[1]: field 'context_len' = 0"]),
    (lambda d: d["tables"][1].update(context_len=512), ["context_len [512, 512] must be strictly ascending"]),
    (lambda d: d.update(context_lens=[512, 2048]), ["field 'context_lens' [512, 2048] does not match", "[512, 1536]"]),
    (lambda d: d["tables"][0]["iteration_ms"]["5"].update({"2": -1}),
     ["p.json: tables[0]: iteration_ms['5']['2'] = -1 is not a positive number of ms"]),
    (lambda d: d["tables"][1].pop("iteration_ms"), ["p.json: tables[1]: missing field 'iteration_ms'"]),
    (lambda d: d["tables"][0].update(decode_ms={"1": "abc"}), ["p.json: tables[0]: decode_ms['1'] = 'abc'"]),
    (lambda d: d.update(acceptance={"per_position": [1.5]}), ["p.json: acceptance.per_position[0] = 1.5"]),
])
def test_bad_profiles_name_the_file_and_field(edit, words):
    doc = profile_doc()
    edit(doc)
    with pytest.raises(DynspecError) as e:
        Profile.from_json(doc, "p.json")
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("edit,words", [
    (lambda d: d["tables"][1]["iteration_ms"].pop("5"), ["p.json: tables[1]: iteration_ms has batch sizes [1]"]),
    (lambda d: d["tables"][1]["iteration_ms"]["5"].pop("2"), ["p.json: tables[1]: iteration_ms['5'] has K [0]"]),
    (lambda d: [t["iteration_ms"][b].pop("0") for t in d["tables"] for b in ("1", "5")], ["p.json: no K=0"]),
])
def test_cost_model_needs_one_full_grid(edit, words, tmp_path):
    doc = profile_doc()
    edit(doc)
    with pytest.raises(DynspecError) as e:
        CostModel.from_profile(Profile.from_json(doc, "p.json"), "p.json")
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    path = tmp_path / "q.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DynspecError, match=str(path)):
        CostModel.load(path)


def test_cost_model_refuses_a_format_one_file_without_its_context(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"iteration_ms": {"1": {"0": 1.0}}}))
    assert Profile.load(path).context_lens == (None,)                 # tune still reads it
    with pytest.raises(DynspecError, match=f"{path}: missing field 'context_len'"):
        CostModel.load(path)


def test_context_table_json_keys_are_strings():
    t = ContextTable(64, {2: {1: 3.0, 0: 2.0}}, {2: 1.5})
    assert t.to_json() == {"context_len": 64, "iteration_ms": {"2": {"0": 2.0, "1": 3.0}}, "decode_ms": {"2": 1.5}}


def test_importing_the_cost_model_loads_no_torch():
    code = "import sys, dynspec.runtime.policy.cost_model; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_row_is_lookup_for_every_k_at_once():
    """The policy's one call per iteration equals a lookup per K, inside and outside the grid."""
    from dynspec.runtime.policy.cost_model import CostModel

    c = CostModel("t", (256, 1024), (1, 8, 64), (0, 1, 3), None,
                  (((4.0, 4.4, 5.0), (4.5, 5.0, 6.0), (9.0, 11.0, 15.0)),
                   ((5.0, 5.5, 6.5), (5.5, 6.2, 7.5), (11.0, 14.0, 20.0))))
    for b, ctx in ((1, 256), (5, 700.0), (64, 1024), (100, 2000.0), (3, 100.0)):
        ms, cold, extrapolated = c.row(b, ctx)
        looks = [c.lookup(b, k, ctx) for k in c.draft_lens]
        assert ms == pytest.approx([x.ms for x in looks])
        assert extrapolated == any(x.extrapolated for x in looks)
        assert cold is None                       # no decode_ms in this model


def test_row_interpolates_plain_decode_like_every_k():
    """decode_ms (K=0 without keep-warm) goes through the same bilinear rule: b=5 is 4/7 of the
    way from 1 to 8, ctx 640 halfway from 256 to 1024:
        ctx 256: 3.6 + 4/7 * (4.3 - 3.6) = 4.0     ctx 1024: 4.6 + 4/7 * (5.3 - 4.6) = 5.0   -> 4.5"""
    from dynspec.runtime.policy.cost_model import CostModel, ContextTable, Profile

    tables = tuple(ContextTable(ctx, {1: {0: 4.0 + d, 1: 4.4 + d}, 8: {0: 4.5 + d, 1: 5.0 + d}},
                                {1: 3.6 + d, 8: 4.3 + d}) for ctx, d in ((256, 0.0), (1024, 1.0)))
    c = CostModel.from_profile(Profile("t", tables))
    ms, cold, _ = c.row(5, 640)
    assert cold == pytest.approx(4.5)
    assert ms[0] == pytest.approx(4.0 + 4 / 7 * 0.5 + 0.5)
    partial = tuple(ContextTable(t.context_len, t.iteration_ms, {1: 3.6}) for t in tables)   # b=8 missing
    assert CostModel.from_profile(Profile("t", partial)).row(5, 640)[1] is None
