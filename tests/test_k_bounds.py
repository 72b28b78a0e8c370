"""Every K is bounded by the engine's max_draft_len (the schedule it was built with): a cost model
profiling a larger K is refused by `build --cost-model`, by `generate --cost-model` and when an
engine dir of policy "adaptive" is loaded; a `generate --schedule` above the engine's K likewise.
Each refusal is exit 2 (or a DynspecError) with one line naming the file or flag and the K."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_checkpoints import make_eagle3, make_llama  # noqa: E402

from dynspec.cli import main  # noqa: E402
from dynspec.config import EngineConfig  # noqa: E402
from dynspec.errors import DynspecError  # noqa: E402
from dynspec.runtime.policy.cost_model import ContextTable, Profile  # noqa: E402
from dynspec.runtime.generate.session import policy_of  # noqa: E402


def cost_file(path: Path, kmax: int) -> Path:
    """A one-context profile timing K = 0..kmax at batch sizes 1 and 4."""
    rows = {b: {k: 10.0 + b + k for k in range(kmax + 1)} for b in (1, 4)}
    path.write_text(json.dumps(Profile("synthetic", (ContextTable(64, rows),)).to_json()))
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("kpair")
    make_llama(root / "hf", layers=2)
    (root / "hf" / "tokenizer_config.json").unlink()       # no tokenizer: generate runs on token ids
    make_eagle3(root / "eagle", n_capture=2, cfg_extra={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1]}})
    assert main(["convert", "target", "--hf", str(root / "hf"), "--out", str(root / "target"), "--tp", "1",
                 "--dtype", "float32"]) == 0
    assert main(["convert", "eagle3", "--draft", str(root / "eagle"), "--target", str(root / "target"),
                 "--out", str(root / "draft"), "--tp", "1"]) == 0
    return root / "target", root / "draft"


def build(pair, out: Path, *extra) -> int:
    return main(["build", "--target", str(pair[0]), "--draft", str(pair[1]), "--out", str(out), "--tp", "1",
                 "--schedule", "4:4", *extra])


def one_line(capsys) -> str:
    lines = capsys.readouterr().err.strip("\n").splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_build_refuses_a_cost_model_above_the_schedules_k(pair, tmp_path, capsys):
    big = cost_file(tmp_path / "cost40.json", 40)
    assert build(pair, tmp_path / "e", "--cost-model", str(big)) == 2
    line = one_line(capsys)
    assert str(big) in line and "K=40" in line and "max_draft_len 4" in line, line
    assert not (tmp_path / "e").exists()
    assert build(pair, tmp_path / "e", "--cost-model", str(cost_file(tmp_path / "cost4.json", 4))) == 0


@pytest.fixture(scope="module")
def adaptive_engine(pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("kengine") / "e"
    assert build(pair, out, "--cost-model", str(cost_file(out.parent / "cost4.json", 4))) == 0
    return out


def test_loading_an_engine_whose_cost_model_outgrew_it_is_refused(adaptive_engine, tmp_path):
    import shutil

    eng = tmp_path / "e"
    shutil.copytree(adaptive_engine, eng)
    assert policy_of(EngineConfig.load(eng)).max_draft_len == 4
    assert policy_of(EngineConfig.load(eng)).cost.chunk is None
    from dynspec.runtime.policy import step_prices

    step_prices.write(eng / step_prices.STEP_PRICES, step_prices.StepPrices(chunk_ms_per_token=0.03), "cpu", ["x"], [])
    assert type(policy_of(EngineConfig.load(eng)).cost.chunk).__name__ == "FittedChunk"   # the engine dir's prices
    cost_file(eng / "cost_model.json", 40)
    with pytest.raises(DynspecError, match=r"cost_model.json: profiles K=40, above the engine's max_draft_len 4 "
                                           r"\(engine.json schedule 4:4\)"):
        policy_of(EngineConfig.load(eng))


def test_generate_refuses_a_cost_model_above_the_engines_k(adaptive_engine, tmp_path, capsys):
    big = cost_file(tmp_path / "cost40.json", 40)
    assert main(["generate", "--engine-dir", str(adaptive_engine), "--modes", "adaptive", "--cost-model", str(big),
                 "--num-prompts", "1", "--max-new-tokens", "2"]) == 2
    line = one_line(capsys)
    assert str(big) in line and "K=40" in line and "max_draft_len 4" in line and "engine.json" in line, line


def test_generate_on_a_pair_refuses_a_cost_model_above_the_largest_k(tmp_path, capsys):
    big = cost_file(tmp_path / "cost40.json", 40)
    assert main(["generate", "--modes", "adaptive", "--cost-model", str(big), "--num-prompts", "1",
                 "--max-new-tokens", "2"]) == 2
    line = one_line(capsys)
    assert str(big) in line and "K=40" in line and "max_draft_len 32" in line, line


def test_generate_refuses_a_schedule_above_the_engines_k(adaptive_engine, capsys):
    assert main(["generate", "--engine-dir", str(adaptive_engine), "--schedule", "4:8", "--num-prompts", "1",
                 "--max-new-tokens", "2"]) == 2
    line = one_line(capsys)
    assert "--schedule 4:8" in line and "K=8" in line and "max_draft_len 4" in line, line


def test_a_prefill_cap_is_an_engine_json_field_the_served_policy_reads(pair, tmp_path, capsys):
    """`build --prefill-k 1` keeps engine.json prefill_k (with a warning: TensorRT-LLM has no such
    cap), and the served policy is the schedule capped on steps that end a prefill; a bad value, or
    one beside a cost model, is refused naming the flag or field."""
    from dynspec.runtime.policy.prefill_cap import PrefillCap

    assert build(pair, tmp_path / "e", "--prefill-k", "1") == 0
    assert "--prefill-k 1 is the reference engine's" in capsys.readouterr().err
    cfg = EngineConfig.load(tmp_path / "e")
    assert cfg.prefill_k == 1 and json.loads((tmp_path / "e" / "engine.json").read_text())["prefill_k"] == 1
    pol = policy_of(cfg)
    assert isinstance(pol, PrefillCap) and pol.schedule == cfg.schedule and pol.prefill_k == "1"
    assert build(pair, tmp_path / "f", "--prefill-k", "-1") == 2
    assert "--prefill-k -1 must be at least 0" in one_line(capsys)
    assert build(pair, tmp_path / "g", "--prefill-k", "0", "--cost-model", str(cost_file(tmp_path / "c.json", 4))) == 2
    assert "--prefill-k 0 caps a schedule's K" in one_line(capsys)
    # a cap by batch size from a file: engine.json keeps its text, not the file's name
    (tmp_path / "cap.txt").write_text("3:1\n")
    assert build(pair, tmp_path / "h", "--prefill-k", f"@{tmp_path / 'cap.txt'}") == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "h" / "engine.json").read_text())["prefill_k"] == "3:1"
    assert policy_of(EngineConfig.load(tmp_path / "h")).limit == "K<=1 up to 3 rows, 0 above"
    doc = json.loads((tmp_path / "e" / "engine.json").read_text())
    for bad, match in ((True, "field 'prefill_k' is True"), ("1", "field 'prefill_k' is '1'"),
                       ("@cap.txt", "field 'prefill_k' is '@cap.txt'"), ("4:1,2:2", "field 'prefill_k' '4:1,2:2'")):
        with pytest.raises(DynspecError, match=match):
            EngineConfig.from_json({**doc, "prefill_k": bad})
    with pytest.raises(DynspecError, match="field 'prefill_k' caps a schedule's K; policy 'adaptive'"):
        EngineConfig.from_json({**doc, "policy": "adaptive"})


def test_generate_serves_engine_jsons_prefill_cap(pair, tmp_path, capsys):
    """`dynspec generate --engine-dir` runs the dynamic mode as the server does: engine.json prefill_k
    caps K on every step that ends a waiting prompt's prefill (its stats: the prompts waiting that the
    decision read), and the header says so; the other steps run the schedule's K."""
    from dynspec.runtime.policy.prefill_price import finishing

    assert build(pair, tmp_path / "e", "--prefill-k", "0") == 0
    cfg = EngineConfig.load(tmp_path / "e")
    stats, prompts = tmp_path / "s.jsonl", tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "input_ids": [(7 * i + j) % 90 + 3 for j in range(n)]}) + "\n"
                               for i, n in enumerate((6, 30, 8, 25, 12))))    # under 16 tokens a step: staggered
    capsys.readouterr()
    assert main(["generate", "--engine-dir", str(tmp_path / "e"), "--modes", "dynamic", "--concurrency", "2",
                 "--prompts", str(prompts), "--max-new-tokens", "12", "--max-num-tokens", "16",
                 "--stats", str(stats)]) == 0
    assert "K<=0 on steps that end a prefill" in capsys.readouterr().out
    rows = [json.loads(line) for line in stats.read_text().splitlines()]
    budget = 16
    ends = [r for r in rows if r["batch_size"] and r["waiting"]
            and finishing(r["waiting"], budget - r["batch_size"] * (cfg.schedule.draft_len(r["batch_size"]) + 1))]
    assert ends and all(r["k"] == 0 for r in ends)
    assert any(r["k"] == cfg.schedule.draft_len(r["batch_size"]) > 0 for r in rows if r["batch_size"] and r not in ends)
