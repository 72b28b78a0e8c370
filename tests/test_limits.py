"""Limits of an engine dir, the reference runtime and the CLIs: each bad value is refused in one
line naming the file, field or flag and the number, before any model or cache is allocated.

Engine dirs here are engine.json files written by hand around the embedded tiny pair (6 layers,
2 KV heads of 32, max_position_embeddings 1024), so every command runs in seconds on a CPU."""
import json
import shutil
from pathlib import Path

import pytest

from dynspec.cli import main
from dynspec.config import EngineConfig, ReferenceSettings
from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.generate.session import tiny_pair_dirs


def tiny_engine_dir(root: Path, *, top_batch=8, ref_batch=8, ref_seq=256, **edit) -> Path:
    """ENGINE_DIR/engine.json for the embedded tiny pair; `edit` overwrites top-level fields of
    the written JSON afterwards (bad values a hand-edited file may hold)."""
    target, draft = tiny_pair_dirs()
    out = root / "engine"
    cfg = EngineConfig(target_dir=target, draft_dir=draft, schedule=DraftSchedule.parse("4:4,8:2"),
                       max_batch_size=top_batch, max_seq_len=1024,
                       reference=ReferenceSettings(max_batch_size=ref_batch, max_seq_len=ref_seq))
    cfg.write(out)
    if edit:
        d = json.loads((out / "engine.json").read_text())
        for k, v in edit.items():
            if isinstance(v, dict) and isinstance(d.get(k), dict):
                d[k].update(v)
            else:
                d[k] = v
        (out / "engine.json").write_text(json.dumps(d))
    return out


def one_line_error(capsys, argv) -> str:
    """Run the CLI; it must exit 2 with exactly one stderr line, which is returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---- engine.json: one reader, every field type-checked ------------------------------------------
@pytest.mark.parametrize("field,value,words", [
    ("tp", "8", ["'tp'", "'8'", "integer"]),
    ("tp", 0, ["'tp'", "0", "at least 1"]),
    ("tp", True, ["'tp'", "True", "integer"]),
    ("max_batch_size", -1, ["'max_batch_size'", "-1", "at least 1"]),
    ("max_seq_len", "big", ["'max_seq_len'", "'big'", "integer"]),
    ("max_seq_len", 2.0, ["'max_seq_len'", "2.0", "integer"]),
    ("target_dir", 7, ["'target_dir'", "7", "string"]),
    ("trtllm_version", ["1.2.1"], ["'trtllm_version'", "string"]),
    ("llm_api_options", None, ["'llm_api_options'", "None", "string"]),
    ("manifests", [], ["'manifests'", "object"]),
    ("build", "x", ["'build'", "object"]),
    ("reference", {"max_seq_len": "big"}, ["reference.max_seq_len", "'big'"]),
    ("reference", {"max_batch_size": 9}, ["reference.max_batch_size", "9", "max_batch_size 8"]),
])
def test_engine_json_fields_are_type_checked(tmp_path, field, value, words):
    eng = tiny_engine_dir(tmp_path, **{field: value})
    with pytest.raises(DynspecError) as e:
        EngineConfig.load(eng)
    msg = str(e.value)
    assert "\n" not in msg and str(eng / "engine.json") in msg
    for w in words:
        assert w in msg, (w, msg)


def test_generate_and_triton_refuse_a_string_tp(tmp_path, capsys):
    eng = tiny_engine_dir(tmp_path, tp="8")
    err = one_line_error(capsys, ["generate", "--engine-dir", str(eng), "--num-prompts", "1", "--max-new-tokens", "2"])
    assert "'tp'" in err and "'8'" in err
    err = one_line_error(capsys, ["triton", "--engine-dir", str(eng), "--out", str(tmp_path / "repo")])
    assert "'tp'" in err and "'8'" in err
    assert not (tmp_path / "repo").exists()


def test_deeply_nested_engine_json_is_one_line(tmp_path):
    eng = tiny_engine_dir(tmp_path)
    d = json.loads((eng / "engine.json").read_text())
    text = json.dumps(d)[:-1] + ', "build": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (eng / "engine.json").write_text(text)
    with pytest.raises(DynspecError, match="nested"):
        EngineConfig.load(eng)


def test_a_good_engine_json_round_trips(tmp_path):
    eng = tiny_engine_dir(tmp_path)
    cfg = EngineConfig.load(eng)
    assert (cfg.tp, cfg.max_batch_size, cfg.reference.max_batch_size) == (8, 8, 8)
    assert EngineConfig.from_json(cfg.to_json()) == cfg


# ---- one max batch size per engine dir -----------------------------------------------------------
def test_generate_refuses_concurrency_above_the_engine_dirs_batch_limit(tmp_path, capsys):
    eng = tiny_engine_dir(tmp_path, top_batch=8, ref_batch=8)
    err = one_line_error(capsys, ["generate", "--engine-dir", str(eng), "--concurrency", "16",
                                  "--num-prompts", "2", "--max-new-tokens", "2"])
    assert "--concurrency 16" in err and "8" in err and "max_batch_size" in err


def test_generate_at_the_limit_never_runs_more_rows(tmp_path, capsys):
    eng = tiny_engine_dir(tmp_path, top_batch=8, ref_batch=4)
    stats = tmp_path / "stats.jsonl"
    assert main(["generate", "--engine-dir", str(eng), "--concurrency", "4", "--num-prompts", "6",
                 "--max-new-tokens", "4", "--stats", str(stats)]) == 0
    rows = [json.loads(ln)["batch_size"] for ln in stats.read_text().splitlines()]
    assert max(rows) == 4


def test_sweep_refuses_concurrency_above_the_engine_dirs_batch_limit(tmp_path, capsys):
    eng = tiny_engine_dir(tmp_path, top_batch=8, ref_batch=8)
    err = one_line_error(capsys, ["sweep", "--engine-dir", str(eng), "--concurrency", "1,16",
                                  "--out", str(tmp_path / "res" / "s")])
    assert "--concurrency" in err and "16" in err and "8" in err and "max_batch_size" in err
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").iterdir())


def test_profile_refuses_batch_sizes_above_the_engine_dirs_batch_limit(tmp_path, capsys):
    eng = tiny_engine_dir(tmp_path, top_batch=8, ref_batch=8)
    err = one_line_error(capsys, ["profile", "--engine-dir", str(eng), "--batch-sizes", "1,256",
                                  "--out", str(tmp_path / "p.json")])
    assert "--batch-sizes" in err and "256" in err and "8" in err and "max_batch_size" in err


# ---- max_seq_len: bounded by the target's positions and by the memory the KV cache needs -------
def test_engine_json_max_seq_len_beyond_the_targets_positions(tmp_path, capsys):
    eng = tiny_engine_dir(tmp_path, reference={"max_seq_len": 10**6})
    err = one_line_error(capsys, ["generate", "--engine-dir", str(eng), "--concurrency", "1", "--num-prompts", "1",
                                  "--max-new-tokens", "2"])
    assert "1000000" in err and "max_position_embeddings 1024" in err


@pytest.mark.parametrize("flag_value", ["10000000", "100000000"])
def test_generate_max_seq_len_flag_beyond_the_targets_positions(capsys, flag_value):
    err = one_line_error(capsys, ["generate", "--max-seq-len", flag_value, "--num-prompts", "1",
                                  "--max-new-tokens", "2"])
    assert flag_value in err and "max_position_embeddings 1024" in err


def long_context_pair(root: Path) -> tuple[Path, Path]:
    """The tiny pair with max_position_embeddings 10**9: only memory bounds its cache."""
    target, draft = tiny_pair_dirs()
    out = []
    for name, src in (("target", target), ("draft", draft)):
        dst = root / name
        shutil.copytree(src, dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg["max_position_embeddings"] = 10**9
        (dst / "config.json").write_text(json.dumps(cfg))
        out.append(dst)
    return out[0], out[1]


def test_generate_refuses_a_cache_larger_than_memory(tmp_path, capsys):
    from dynspec.cli import make_parser

    target, draft = long_context_pair(tmp_path)
    err = one_line_error(capsys, ["generate", "--target", str(target), "--draft", str(draft),
                                  "--max-seq-len", "10000000", "--num-prompts", "1", "--max-new-tokens", "2"])
    rows = max(make_parser().parse_args(["generate"]).concurrency)       # the cache holds the highest default load
    # rows x 625,000 blocks of 16 + 1 scratch; target 6 layers + draft 1, K and V, 2 heads x 32, fp32
    need = (1 + rows * 625_000) * 16 * (6 + 1) * 2 * 2 * 32 * 4
    assert f"{need:,}" in err and "available" in err and "max_seq_len 10000000" in err


def test_kv_estimate_is_what_the_engine_allocates():
    from dynspec.runtime.engines.reference.load import load_reference_engine

    target, draft = tiny_pair_dirs()
    eng = load_reference_engine(target, draft, max_batch_size=3, max_seq_len=100, max_draft_len=2)
    pools = (eng.target.k_cache, eng.target.v_cache, eng.draft.k_cache, eng.draft.v_cache)
    assert eng.kv_bytes == sum(t.numel() * t.element_size() for t in pools)
    assert eng.kv_bytes == (1 + 3 * 7) * 16 * (6 + 1) * 2 * 2 * 32 * 4


def test_profile_context_lens_beyond_the_targets_positions(tmp_path, capsys):
    err = one_line_error(capsys, ["profile", "--context-lens", "64,100000000", "--batch-sizes", "1", "--no-progress",
                                  "--out", str(tmp_path / "p.json")])
    assert "--context-lens 100000000" in err and "max_position_embeddings 1024" in err


# ---- numeric flags of profile / sweep / generate: bounded, one line each -----------------------
@pytest.mark.parametrize("flags,words", [
    (["--warmup", str(10**12)], ["--warmup", str(10**12)]),
    (["--repeats", str(10**12)], ["--repeats", str(10**12)]),
    (["--threads", "0"], ["--threads 0"]),
    (["--threads", "100000"], ["--threads 100000"]),
    (["--draft-lens", "1000"], ["--draft-lens", "1000", "32"]),
    (["--batch-sizes", str(10**12)], ["--batch-sizes", str(10**12)]),
    (["--max-seq-len", str(10**8)], ["--max-seq-len 100000000", "max_position_embeddings 1024"]),
    (["--context-lens", "64,0"], ["--context-lens", "'64,0'", "needs positive integers"]),
    (["--context-lens", "64,x"], ["--context-lens", "'64,x'", "not a comma-separated list of integers"]),
])
def test_profile_numeric_flags_are_bounded(tmp_path, capsys, flags, words):
    err = one_line_error(capsys, ["profile", "--batch-sizes", "1", "--draft-lens", "0,1", "--no-progress", *flags,
                                  "--out", str(tmp_path / "p.json")])
    for w in words:
        assert w in err, (w, err)
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("flags,words", [
    (["--static-k", "1000"], ["--static-k 1000", "32"]),
    (["--trials", str(10**9)], ["--trials", str(10**9)]),
    (["--threads", "0"], ["--threads 0"]),
    (["--input-len", str(10**9)], ["--input-len", "max_position_embeddings 1024"]),
    (["--warmup-requests", str(10**12)], ["--warmup-requests", str(10**12)]),
])
def test_sweep_numeric_flags_are_bounded(tmp_path, capsys, flags, words):
    err = one_line_error(capsys, ["sweep", "--concurrency", "1", "--no-progress", *flags,
                                  "--out", str(tmp_path / "res" / "s")])
    for w in words:
        assert w in err, (w, err)


# ---- prompts files: read line by line, each line and the count bounded ---------------------------
def test_a_sparse_prompts_file_is_refused_without_reading_it_whole(tmp_path):
    import tracemalloc

    from dynspec.runtime.serving.driver import MAX_PROMPT_LINE_BYTES, read_prompt_lines

    f = tmp_path / "sparse.jsonl"
    with open(f, "wb") as fh:
        fh.truncate(300 * 2**20)                 # 300 MiB of NUL bytes, no newline, nothing on disk
    tracemalloc.start()
    try:
        with pytest.raises(DynspecError) as e:
            read_prompt_lines(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{f}:1" in str(e.value) and f"{MAX_PROMPT_LINE_BYTES:,}" in str(e.value)
    assert peak < 4 * MAX_PROMPT_LINE_BYTES, peak


def test_prompt_count_is_bounded(tmp_path, monkeypatch):
    from dynspec.runtime.serving import driver

    monkeypatch.setattr(driver, "MAX_PROMPTS", 3)
    f = tmp_path / "p.jsonl"
    f.write_text("".join(f'{{"id": "{i}", "input_ids": [1, 2]}}\n' for i in range(4)))
    with pytest.raises(DynspecError, match=r"p.jsonl:4: .*more than 3 prompts"):
        driver.read_prompt_lines(f)
    f.write_text("".join(f'{{"id": "{i}", "input_ids": [1, 2]}}\n' for i in range(3)))
    assert len(driver.read_prompt_lines(f)) == 3


def test_dataset_files_use_the_same_bounded_reader(tmp_path):
    from dynspec.benchmarks.workload import load_jsonl

    f = tmp_path / "d.jsonl"
    with open(f, "wb") as fh:
        fh.truncate(64 * 2**20)
    with pytest.raises(DynspecError, match=r"d.jsonl:1: .*longer than"):
        load_jsonl(f)


# ---- the trtllm-llmapi repository needs ENGINE_DIR/llm_api_options.yaml -----------------------
def test_triton_llmapi_refuses_an_engine_dir_without_its_options_file(tmp_path, capsys):
    eng = tiny_engine_dir(tmp_path)                  # engine.json alone: no llm_api_options.yaml
    err = one_line_error(capsys, ["triton", "--engine-dir", str(eng), "--out", str(tmp_path / "repo"),
                                  "--variant", "trtllm-llmapi"])
    assert str(eng / "llm_api_options.yaml") in err and "max_num_tokens" in err
    assert not (tmp_path / "repo").exists()
