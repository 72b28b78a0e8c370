"""`dynspec build`: converted tiny checkpoints -> ENGINE_DIR (LLM-API YAML, engine.json,
baseline script), read back through EngineConfig.load; the memory plan against hand-computed
numbers for a 70B-shaped model; the K=0 trap warning; all-or-nothing writes."""
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_checkpoints import make_eagle3, make_llama  # noqa: E402

from dynspec.build.llm_api import decode_tokens, graph_batch_sizes  # noqa: E402
from dynspec.build.plan import activation_bytes_per_token, memory_plan  # noqa: E402
from dynspec.build.trap import floor_schedule  # noqa: E402
from dynspec.build.validate import validate_options  # noqa: E402
from dynspec.checkpoint.shapes import (ModelShape, eagle3_weight_bytes_per_rank, kv_bytes_per_token_per_rank,  # noqa: E402
                                       param_count, weight_bytes_per_rank)
from dynspec.cli import main  # noqa: E402
from dynspec.config import EngineConfig  # noqa: E402
from dynspec.errors import DynspecError  # noqa: E402
from dynspec.runtime.policy import DraftSchedule  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    make_llama(root / "hf")
    make_eagle3(root / "eagle")
    assert main(["convert", "target", "--hf", str(root / "hf"), "--out", str(root / "target"), "--dtype", "float32"]) == 0
    assert main(["convert", "eagle3", "--draft", str(root / "eagle"), "--target", str(root / "target"),
                 "--out", str(root / "draft")]) == 0
    return root / "target", root / "draft"


def build(pair, out, *extra):
    target, draft = pair
    return main(["build", "--target", str(target), "--draft", str(draft), "--out", str(out), *extra])


def test_build_writes_a_loadable_engine_dir(pair, tmp_path, capsys):
    out = tmp_path / "engines" / "e1"
    assert build(pair, out, "--schedule", "4:4,8:2,32:1", "--max-batch-size", "64", "--baseline-trt-engine") == 0
    assert sorted(p.name for p in out.iterdir()) == ["build_baseline_trt_engine.sh", "engine.json", "llm_api_options.yaml"]
    cfg = EngineConfig.load(out)
    assert Path(cfg.target_dir) == pair[0].resolve() and Path(cfg.draft_dir) == pair[1].resolve()
    raw = json.loads((out / "engine.json").read_text())
    assert raw["target_dir"] == os.path.relpath(pair[0].resolve(), out.resolve())   # relative to ENGINE_DIR
    assert cfg.schedule.tiers == ((4, 4), (8, 2), (32, 1)) and cfg.tp == 8 and cfg.trtllm_version == "1.2.1"
    assert raw["trtllm_draft_len_schedule"] == {"1": 4, "5": 2, "9": 1, "33": 0}
    assert cfg.manifests["target"]["kind"] == "target" and cfg.manifests["draft"]["capture_layers"] == [1, 3, 4]
    assert cfg.build["memory_plan"]["kv_tokens"] > 0
    assert cfg.reference.max_batch_size == 64 and cfg.reference.max_seq_len == 512
    opts = yaml.safe_load((out / "llm_api_options.yaml").read_text())
    sc = opts["speculative_config"]
    assert sc["draft_len_schedule"] == {1: 4, 5: 2, 9: 1, 33: 0} and sc["eagle3_one_model"] is False
    assert sc["speculative_model_dir"] == str(pair[1].resolve()) and opts["model"] == str(pair[0].resolve())
    assert "speculative_model" not in sc                            # the pre-PR-10099 name only, never both
    assert sc["eagle3_layers_to_capture"] == [1, 3, 4]
    assert opts["cuda_graph_config"]["batch_sizes"] == [1, 2, 4, 5, 8, 9, 16, 32, 33, 64]
    assert opts["max_seq_len"] == 512                               # min(4096, max_position_embeddings)
    assert "warning" in capsys.readouterr().err                      # K=0 above 32 on 1.2.1


def test_trap_warning_and_min_draft_len(pair, tmp_path, capsys):
    assert build(pair, tmp_path / "a", "--threshold", "5", "--max-draft-len", "4", "--max-batch-size", "32") == 0
    err = capsys.readouterr().err
    assert "K=0" in err and "from batch size 6" in err and "--min-draft-len" in err
    assert build(pair, tmp_path / "b", "--threshold", "5", "--max-draft-len", "4", "--max-batch-size", "32",
                 "--min-draft-len", "1") == 0
    assert "warning" not in capsys.readouterr().err
    cfg = EngineConfig.load(tmp_path / "b")
    assert cfg.schedule.tiers == ((5, 4), (32, 1))
    assert all(cfg.schedule.draft_len(b) >= 1 for b in range(1, 33))
    assert cfg.build["requested_schedule"] == "5:4"


def test_trap_warning_says_what_each_drafter_does_at_k0():
    """1.2.x: the two-model drafter is skipped at K=0 and never catches up (read from the 1.2-era
    PyExecutor/ModelDrafter); PR 16888 describes the one-engine path only, so it is the source
    for 1.3.x, not for 1.2.x (docs/design.md, section 2, "Stale draft at K=0")."""
    from dynspec.build.trap import trap_warning

    s = DraftSchedule(((5, 4),))
    w12 = trap_warning("1.2.1", s, 32)
    assert len(w12.splitlines()) == 1 and "from batch size 6" in w12
    for fact in ("two-model EAGLE-3 drafter (eagle3_one_model: false) is skipped while K=0",
                 "no forward over the tokens the target emits", "KV cache keeps allocating their positions",
                 "only the newest token, with no catch-up prefill", "draft-KV rows that were never written",
                 "PR 16888, still open, covers one-engine drafters only"):
        assert fact in w12, fact
    w13 = trap_warning("1.3.0rc5", s, 32)
    assert "one-engine drafter" in w13 and "(TRT-LLM PR 16888, still open)" in w13 and "two-model" not in w13
    assert trap_warning("1.2.1", DraftSchedule(((32, 4),)), 32) is None      # K never reaches 0 up to 32


def test_floor_schedule():
    s = DraftSchedule(((4, 4), (8, 2)))
    assert floor_schedule(s, 1, 64).tiers == ((4, 4), (8, 2), (64, 1))
    assert floor_schedule(s, 3, 64).tiers == ((4, 4), (64, 3))
    assert floor_schedule(s, 0, 64) is s
    with pytest.raises(DynspecError, match="exceeds the schedule's max_draft_len"):
        floor_schedule(s, 5, 64)


def test_version_13_renders_upper_bounds(pair, tmp_path):
    assert build(pair, tmp_path / "e", "--schedule", "4:4,8:2", "--trtllm-version", "1.3.0rc5",
                 "--max-batch-size", "16", "--min-draft-len", "1") == 0
    sc = yaml.safe_load((tmp_path / "e" / "llm_api_options.yaml").read_text())["speculative_config"]
    assert sc["draft_len_schedule"] == {4: 4, 8: 2, 16: 1} and "eagle3_one_model" not in sc


def test_plan_only_prints_and_writes_nothing(pair, tmp_path, capsys):
    target, draft = pair
    assert main(["build", "--target", str(target), "--draft", str(draft), "--plan", "--threshold", "4",
                 "--max-draft-len", "3", "--min-draft-len", "1"]) == 0
    out = capsys.readouterr().out
    for row in ("target weights", "draft weights", "CUDA-graph pool", "KV capacity", "concurrent requests"):
        assert row in out
    assert not any(tmp_path.iterdir())


def test_build_errors(pair, tmp_path, capsys):
    out = tmp_path / "e"
    out.mkdir()
    (out / "x").write_text("x")
    assert build(pair, out, "--threshold", "4", "--max-draft-len", "4") == 2
    assert "--force" in capsys.readouterr().err
    assert build(pair, tmp_path / "f", "--threshold", "4", "--max-draft-len", "4", "--tp", "4") == 2
    assert "converted for tp=8" in capsys.readouterr().err
    assert build(pair, tmp_path / "g", "--threshold", "4", "--max-draft-len", "4", "--max-seq-len", "9999") == 2
    assert "max_position_embeddings 512" in capsys.readouterr().err
    target, draft = pair
    assert main(["build", "--target", str(draft), "--draft", str(draft), "--out", str(tmp_path / "h"),
                 "--threshold", "4", "--max-draft-len", "4"]) == 2
    assert "field 'kind' is 'eagle3-draft'; expected 'target'" in capsys.readouterr().err
    assert not (tmp_path / "f").exists() and not (tmp_path / "h").exists()


def test_build_failure_leaves_nothing(pair, tmp_path, monkeypatch):
    def broken_write(self, engine_dir):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(EngineConfig, "write", broken_write)
    with pytest.raises(OSError, match="injected"):
        build(pair, tmp_path / "e", "--threshold", "4", "--max-draft-len", "4")
    assert list(tmp_path.iterdir()) == []


def test_baseline_script_runs(pair, tmp_path, monkeypatch, capsys):
    """--run executes the legacy two-step script; stand-ins for convert_checkpoint.py and
    trtllm-build record their arguments and create their output folders."""
    examples = tmp_path / "examples"
    conv = examples / "models/core/llama/convert_checkpoint.py"
    conv.parent.mkdir(parents=True)
    conv.write_text("import sys, os, json\nargs = sys.argv[1:]\nout = args[args.index('--output_dir') + 1]\n"
                    "os.makedirs(out)\njson.dump(args, open(os.path.join(out, 'args.json'), 'w'))\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_build = bindir / "trtllm-build"
    fake_build.write_text("#!/usr/bin/env bash\nset -e\nwhile [ $# -gt 0 ]; do [ \"$1\" = --output_dir ] && out=$2; "
                          "shift; done\nmkdir -p \"$out\"\necho ok > \"$out/rank0.engine\"\n")
    fake_build.chmod(fake_build.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("TRTLLM_EXAMPLES_DIR", str(examples))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "e"
    assert build(pair, out, "--threshold", "4", "--max-draft-len", "4", "--baseline-trt-engine", "--run") == 0
    args = json.loads((out / "baseline_trt_engine" / "checkpoint" / "args.json").read_text())
    assert args[args.index("--tp_size") + 1] == "8" and args[args.index("--model_dir") + 1] == str(pair[0].resolve())
    assert (out / "baseline_trt_engine" / "engine" / "rank0.engine").is_file()
    assert not (out / "baseline_trt_engine.tmp").exists()
    script = (out / "build_baseline_trt_engine.sh").read_text()
    assert "--max_batch_size 256" in script and "--max_seq_len 512" in script and "--gemm_plugin auto" in script


def test_validate_rejects_what_trtllm_rejects():
    def opts(sched, **spec):
        return {"backend": "pytorch", "max_batch_size": 64,
                "cuda_graph_config": {"batch_sizes": [1, 2, 4, 5, 8, 16, 32, 64]},
                "speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 4, "eagle3_one_model": False,
                                       "draft_len_schedule": sched, **spec}}

    validate_options(opts({1: 4, 5: 2, 65: 0}), "1.2.1")
    for sched, spec, version, phrase in [
        ({2: 4, 5: 0}, {}, "1.2.1", "needs key 1"),
        ({1: 3, 5: 0}, {}, "1.2.1", "draft_len_schedule[1] == max_draft_len=4"),
        ({1: 4, 5: 0}, {"eagle3_one_model": True}, "1.2.1", "eagle3_one_model is True"),
        ({1: 2, 5: 3}, {"max_draft_len": 3}, "1.2.1", "K increases from 2 to 3"),
        ({1: 4, 3: 1}, {}, "1.2.1", "keys [3] are not in cuda_graph_config.batch_sizes"),
        ({4: 4, 8: 2}, {"max_concurrency": 8}, "1.3.0", "rejects max_concurrency"),
        ({4: 3, 8: 2}, {}, "1.3.0", "smallest key's value == max_draft_len=4"),
    ]:
        with pytest.raises(DynspecError, match=phrase.replace("[", r"\[").replace("]", r"\]")):
            validate_options(opts(sched, **spec), version)


def test_graph_sizes_and_decode_tokens():
    s = DraftSchedule(((4, 4), (8, 2), (32, 1)))
    assert graph_batch_sizes(s, s.to_trtllm("1.2.1"), 64) == [1, 2, 4, 5, 8, 9, 16, 32, 33, 64]
    # 1.2.x pads drafting requests to max_draft_len: max(4*5, 8*5, 32*5, 64*1) = 160
    assert decode_tokens(s, 64, "1.2.1") == 160
    # 1.3.x uses each tier's own K: max(4*5, 8*3, 32*2, 64*1) = 64
    assert decode_tokens(s, 64, "1.3.0") == 64


# ---- memory plan: a 70B-shaped target + its EAGLE-3 draft at tp 8 on a 141 GB H200 -------------
LLAMA_70B = ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672,
                       vocab=128256, max_position_embeddings=131072)
DRAFT_70B = ModelShape(layers=1, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672, vocab=128256)


def test_70b_shapes_by_hand():
    # per layer, per rank (bf16 weights, tp 8; 8 KV heads -> 1 per rank):
    q = 8192 * (64 * 128 // 8)            # q_proj: 8192 x 1024      =  8,388,608
    kv = 2 * 8192 * 128                   # k_proj + v_proj: 1 head  =  2,097,152
    o = (64 * 128 // 8) * 8192            # o_proj                   =  8,388,608
    mlp = 3 * 8192 * (28672 // 8)         # gate, up, down           = 88,080,384
    norms = 2 * 8192                      #                          =     16,384
    layer = q + kv + o + mlp + norms
    assert layer == 106_971_136
    vocab = 2 * (128256 // 8) * 8192      # embed + lm_head, 16032 rows each = 262,668,288
    total_params = 80 * layer + vocab + 8192          # + final norm
    assert weight_bytes_per_rank(LLAMA_70B, 8, "bfloat16") == total_params * 2 == 17_640_734_720
    assert param_count(LLAMA_70B) == 70_553_706_496   # Llama-3-70B
    # KV per token per rank: K and V x 80 layers x 1 head x 128 x 2 bytes
    assert kv_bytes_per_token_per_rank(LLAMA_70B, 8, "bfloat16") == 2 * 80 * 128 * 2 == 40_960
    # draft: attention reads [embed; fused] = 2 x 8192 inputs
    d_attn = 2 * 8192 * (1024 + 2 * 128) + 1024 * 8192   # 29,360,128
    d_mlp = 3 * 8192 * 3584                              # 88,080,384
    d_norms = 4 * 8192                                   #     32,768
    d_fc = 3 * 8192 * 8192                               # 201,326,592, replicated
    d_head = (32000 // 8) * 8192                         # 32,768,000, draft vocab 32000
    d_bytes = (d_attn + d_mlp + d_norms + d_fc + d_head) * 2 + 32000 * 4   # + d2t int32
    assert d_bytes == 703_263_744
    assert eagle3_weight_bytes_per_rank(DRAFT_70B, 32000, 8192, 3, False, 8, "bfloat16") == d_bytes
    # live activations per token in a captured graph: 2 bytes x (hidden, residual, norm out 3 x 8192
    # + q|k|v (8 + 2) x 128 + gate|up 2 x 3584) + fp32 logits 16032 x 4
    assert activation_bytes_per_token(LLAMA_70B, 8, "bfloat16") == 2 * (3 * 8192 + 10 * 128 + 2 * 3584) + 4 * 16032 == 130_176


def test_70b_memory_plan_by_hand(tmp_path, capsys):
    s = DraftSchedule(((4, 4), (8, 2), (32, 1)))
    graph_tokens = decode_tokens(s, 256, "1.2.1")
    assert graph_tokens == 256                         # max(4*5, 8*5, 32*5, 256*1)
    plan = memory_plan(target=LLAMA_70B, tp=8, dtype="bfloat16", target_weight_bytes=17_640_734_720,
                       draft_weight_bytes=703_263_744, kv_bytes_per_token=40_960 + 512, graph_tokens=256,
                       gpu_bytes=141 * 10**9, kv_fraction=0.9, max_seq_len=4096, max_batch_size=256)
    pool = 256 * 130_176                               # 33,325,056
    reserve = 2 * 2**30                                # 2,147,483,648
    free = 141_000_000_000 - 17_640_734_720 - 703_263_744 - pool - reserve
    assert free == 120_475_192_832
    budget = int(free * 0.9)                           # 108,427,673,548
    block = 32 * (40_960 + 512)                        # 32 tokens x (target + draft KV) = 1,327,104 bytes
    assert plan.graph_pool_bytes == pool and plan.kv_budget_bytes == budget == 108_427_673_548
    assert plan.kv_tokens == (budget // block) * 32 == 81_702 * 32 == 2_614_464
    assert plan.concurrent_requests == 2_614_464 // 4096 == 638

    # the same numbers through `dynspec build --plan`, from 70B-shaped manifests
    def manifest(kind, shape, weight_bytes, kv_bytes, **extra):
        d = tmp_path / kind
        d.mkdir()
        m = {"format": "dynspec-checkpoint/1", "kind": kind, "dtype": "bfloat16", "tp": 8,
             "shape": shape.to_json(), "parameter_count": 0, "weight_bytes_per_rank": weight_bytes,
             "kv_bytes_per_token_per_rank": kv_bytes, "architecture": "LlamaForCausalLM", **extra}
        (d / "dynspec.json").write_text(json.dumps(m))
        return d

    t = manifest("target", LLAMA_70B, 17_640_734_720, 40_960)
    d = manifest("eagle3-draft", DRAFT_70B, 703_263_744, 512, capture_layers=[1, 39, 76],
                 target={"layers": 80, "hidden_size": 8192, "vocab_size": 128256})
    assert main(["build", "--target", str(t), "--draft", str(d), "--plan", "--schedule", "4:4,8:2,32:1"]) == 0
    out = capsys.readouterr().out
    assert "2,614,464  tokens" in out and "638  at max_seq_len 4096" in out and "17,640,734,720" in out


def test_reference_engine_reads_engine_dir(pair, tmp_path):
    """convert -> build -> the reference engine opens ENGINE_DIR and generates."""
    pytest.importorskip("dynspec.runtime.engines.reference.load")
    from dynspec.runtime.generate.session import open_executor

    out = tmp_path / "e"
    assert build(pair, out, "--threshold", "4", "--max-draft-len", "3", "--max-batch-size", "8") == 0
    cfg = EngineConfig.load(out)
    ex = open_executor(cfg)
    assert ex.engine.capture == tuple(cfg.manifests["draft"]["capture_layers"])   # same layers TRT-LLM is told
    handle = ex.submit([1, 2, 3, 4], max_new_tokens=6)
    ex.run_until_idle()
    assert len(handle.result().output_ids) == 6


def test_reference_settings_come_from_build_flags(pair, tmp_path):
    """engine.json's reference settings are build's choices, not a later edit of the file."""
    out = tmp_path / "eng"
    assert build(pair, out, "--schedule", "4:4", "--reference-dtype", "bfloat16", "--reference-max-batch-size", "8",
                 "--reference-max-seq-len", "256") == 0
    ref = EngineConfig.load(out).reference
    assert (ref.dtype, ref.max_batch_size, ref.max_seq_len) == ("bfloat16", 8, 256)


@pytest.mark.parametrize("flags,msg", [
    (["--max-seq-len", "0"], "--max-seq-len 0 must be at least 1"),
    (["--reference-max-batch-size", "0"], "--reference-max-batch-size 0 must be at least 1"),
    (["--min-draft-len=-3"], "--min-draft-len -3 must be at least 0"),
    (["--reference-max-seq-len", "513"],
     "--reference-max-seq-len 513 exceeds the target's max_position_embeddings 512"),
    (["--max-batch-size", "8", "--reference-max-batch-size", "9"],
     "--reference-max-batch-size 9 exceeds --max-batch-size 8"),
    (["--max-batch-size", "0"], "--max-batch-size 0 must be at least 1"),
    (["--max-batch-size=-4"], "--max-batch-size -4 must be at least 1"),
    (["--gpu-mem-gb", "nan", "--plan"], "--gpu-mem-gb nan must be a positive number"),
    (["--kv-cache-fraction", "nan"], "--kv-cache-fraction nan must be in (0, 1]"),
    (["--max-num-tokens", "4"], "--max-num-tokens 4 is smaller than one verify window: max K + 1 = 5"),
    (["--max-num-tokens", "0"], "--max-num-tokens 0 must be at least 1"),
])
def test_build_bounds_name_the_value(pair, tmp_path, capsys, flags, msg):
    """Each bad value is one line on stderr, exit 2, nothing written."""
    out = tmp_path / "e"
    assert build(pair, out, "--schedule", "4:4", *flags) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_max_num_tokens_reaches_engine_json_and_trtllm(pair, tmp_path, capsys):
    """--max-num-tokens sets TRT-LLM's max_num_tokens and reference.max_num_tokens;
    a budget below the largest decode iteration (64 x (1+4) on 1.2.x) warns that K is capped."""
    out = tmp_path / "e"
    assert build(pair, out, "--schedule", "4:4", "--max-batch-size", "64", "--min-draft-len", "1",
                 "--max-num-tokens", "100") == 0
    assert "max_num_tokens 100 is below the largest decode iteration (320 tokens" in capsys.readouterr().err
    cfg = EngineConfig.load(out)
    assert cfg.reference.max_num_tokens == 100 and cfg.build["max_num_tokens"] == 100
    assert yaml.safe_load((out / "llm_api_options.yaml").read_text())["max_num_tokens"] == 100
    assert build(pair, tmp_path / "d", "--schedule", "4:4") == 0
    cfg = EngineConfig.load(tmp_path / "d")
    assert cfg.reference.max_num_tokens == 8192 and cfg.build["max_num_tokens"] == 8192
    assert json.loads((tmp_path / "d" / "engine.json").read_text())["reference"]["max_num_tokens"] == 8192


def test_engine_json_budget_below_a_verify_window_is_refused(pair, tmp_path):
    assert build(pair, tmp_path / "e", "--schedule", "4:4") == 0
    raw = json.loads((tmp_path / "e" / "engine.json").read_text())
    raw["reference"]["max_num_tokens"] = 3
    (tmp_path / "e" / "engine.json").write_text(json.dumps(raw))
    window = r"reference.max_num_tokens=3 is smaller than one verify window \(max K \+ 1 = 5\)"
    with pytest.raises(DynspecError, match=window):
        EngineConfig.load(tmp_path / "e")


@pytest.mark.parametrize("out_of", ["target", "draft", "target/sub", "."])
def test_build_out_overlapping_an_input_is_refused(pair, tmp_path, capsys, out_of):
    """--out equal to, inside or containing --target/--draft, even with --force."""
    target, draft = pair
    listing = lambda: [sorted(p.name for p in d.iterdir()) for d in (target, draft)]  # noqa: E731
    before = listing()
    out = target.parent / out_of if out_of != "." else target.parent
    assert build(pair, out, "--schedule", "4:4", "--force") == 2
    err = capsys.readouterr().err
    assert str(out) in err and ("--target" in err or "--draft" in err) and err.count("\n") == 1
    assert listing() == before


def test_generate_flags_override_engine_json_reference(pair, tmp_path):
    """`dynspec generate --max-num-tokens/--max-seq-len/--concurrency` reach ReferenceSettings."""
    from dynspec.cli import make_parser
    from dynspec.runtime.generate.generate_setup import _engine_config

    assert build(pair, tmp_path / "e", "--schedule", "4:4", "--max-num-tokens", "100") == 0
    args = make_parser().parse_args(["generate", "--engine-dir", str(tmp_path / "e")])
    assert _engine_config(args).reference.max_num_tokens == 100
    args = make_parser().parse_args(["generate", "--engine-dir", str(tmp_path / "e"), "--max-num-tokens", "64",
                                     "--max-seq-len", "128", "--concurrency", "3"])
    ref = _engine_config(args).reference
    assert (ref.max_num_tokens, ref.max_seq_len, ref.max_batch_size) == (64, 128, 3)
    args = make_parser().parse_args(["generate", "--engine-dir", str(tmp_path / "e"), "--max-num-tokens", "4"])
    with pytest.raises(DynspecError, match=r"--max-num-tokens 4 is smaller than one verify window \(max K \+ 1 = 5\)"):
        _engine_config(args)
