"""One table of bad inputs for every CLI: each row must exit 2 with exactly one line
on stderr that names the value, and nothing an input holds may change. Rows run in-process through
dynspec.cli.main (one import, ~0.1 s a row); rows that could eat memory or time run in
a subprocess under a timeout, and one row per process path proves the real `python -m` contract."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_checkpoints import make_eagle3, make_llama  # noqa: E402

from dynspec.cli import main  # noqa: E402

PROMPTS = {   # name -> file bytes; the first line is always good, the bad one is line 2
    "bools": b'{"input_ids": [1, 2]}\n{"input_ids": [true, false]}\n',
    "both": b'{"input_ids": [1, 2]}\n{"input_ids": [1], "prompt": "x"}\n',
    "past_vocab": b'{"input_ids": [1, 2]}\n{"input_ids": [1, 5000]}\n',
    "negative": b'{"input_ids": [1, 2]}\n{"input_ids": [1, -3]}\n',
    "huge": b'{"input_ids": [1, 2]}\n{"input_ids": [1, 1e23]}\n',
    "huge_int": b'{"input_ids": [1, 2]}\n{"input_ids": [1, 100000000000000000000000]}\n',
    "binary": b'{"input_ids": [1, 2]}\n\x89PNG\r\n\x1a\n\xff\xfe\x00\x00\n',
    "surrogate": b'{"input_ids": [1, 2]}\n{"prompt": "ab\\ud800"}\n',
    "too_long": b'{"input_ids": [1, 2]}\n{"input_ids": [' + b", ".join([b"7"] * 1100) + b"]}\n",
}

# (row id, argv with {placeholders}, text the one stderr line must hold)
ROWS = [
    # ---- convert (outputs apart from inputs, EAGLE-3 config) ----
    ("convert-out-contains-hf", "convert target --hf {victim}/hf --out {victim} --force --dtype float32",
     "contains --hf"),
    ("convert-out-is-hf", "convert target --hf {victim}/hf --out {victim}/hf --force", "--hf"),
    ("convert-out-inside-hf", "convert target --hf {victim}/hf --out {victim}/hf/sub --force", "lies inside --hf"),
    ("convert-eagle3-out-is-target", "convert eagle3 --draft {eagle} --target {victim_target} --out {victim_target}"
     " --force", "--target"),
    ("convert-read-only-out", "convert target --hf {hf} --out /proc/self/dynspec-t", "/proc/self/dynspec-t"),
    ("convert-truncated-shard", "convert target --hf {sharded} --out {tmp}/t2", "model-00002-of"),
    ("convert-target-hidden-128.7", "convert eagle3 --draft {eagle_bad} --target {target} --out {tmp}/d2", "128.7"),
    # ---- build ----
    ("build-out-is-target", "build --target {target} --draft {draft} --out {target} --force --schedule 4:4",
     "is --target"),
    ("build-max-seq-len-0", "build --target {target} --draft {draft} --out {tmp}/e --schedule 4:4 --max-seq-len 0",
     "--max-seq-len 0"),
    ("build-ref-batch-0", "build --target {target} --draft {draft} --out {tmp}/e --schedule 4:4"
     " --reference-max-batch-size 0", "--reference-max-batch-size 0"),
    ("build-min-draft-len-neg", "build --target {target} --draft {draft} --out {tmp}/e --schedule 4:4"
     " --min-draft-len=-3", "--min-draft-len -3"),
    ("build-ref-seq-past-model", "build --target {target} --draft {draft} --out {tmp}/e --schedule 4:4"
     " --reference-max-seq-len 100000", "100000"),
    ("build-ref-batch-past-max", "build --target {target} --draft {draft} --out {tmp}/e --schedule 4:4"
     " --max-batch-size 8 --reference-max-batch-size 16", "--reference-max-batch-size 16"),
    ("build-max-batch-0", "build --target {target} --draft {draft} --out {tmp}/e --schedule 4:4 --max-batch-size 0",
     "--max-batch-size 0"),
    ("build-max-batch-neg", "build --target {target} --draft {draft} --out {tmp}/e --schedule 4:4"
     " --max-batch-size=-2", "--max-batch-size -2"),
    ("build-gpu-mem-nan", "build --target {target} --draft {draft} --schedule 4:4 --gpu-mem-gb nan --plan", "nan"),
    ("build-max-num-tokens-below-window", "build --target {target} --draft {draft} --out {tmp}/e --schedule 4:4"
     " --max-num-tokens 4", "--max-num-tokens 4"),
    ("build-schedule-huge-k", "build --target {target} --draft {draft} --out {tmp}/e --schedule 4:1000000",
     "1000000"),
    ("build-schedule-unicode-digit", ["build", "--target", "{target}", "--draft", "{draft}", "--out", "{tmp}/e",
                                      "--schedule", "\uff14:4"], "\uff14"),
    ("build-version-newline", ["build", "--target", "{target}", "--draft", "{draft}", "--out", "{tmp}/e",
                               "--schedule", "4:4", "--trtllm-version", "1.2.1\n"], "1.2.1"),
    ("build-read-only-out", "build --target {target} --draft {draft} --out /proc/self/dynspec-e --schedule 4:4",
     "/proc/self/dynspec-e"),
    # ---- generate ----
    *[(f"generate-prompts-{name}", f"generate --prompts {{tmp}}/{name}.jsonl --max-new-tokens 8",
       "2:" if name != "too_long" else "--max-new-tokens 8") for name in PROMPTS],
    ("generate-num-prompts-0", "generate --num-prompts 0", "--num-prompts=0"),
    ("generate-device-cuda", "generate --device cuda --num-prompts 1", "cuda"),
    ("generate-out-dir", "generate --num-prompts 1 --out {tmp}/adir", "is a directory"),
    ("generate-read-only-out", "generate --num-prompts 1 --out /proc/self/out.jsonl", "/proc/self/out.jsonl"),
    ("generate-out-is-prompts", "generate --prompts {tmp}/good.jsonl --out {tmp}/good.jsonl", "is --prompts"),
    ("generate-max-seq-len-0", "generate --num-prompts 1 --max-seq-len 0", "--max-seq-len=0"),
    ("generate-max-num-tokens-3", "generate --num-prompts 1 --max-num-tokens 3", "--max-num-tokens 3"),
    # ---- tune ----
    ("tune-decode-ms-abc", "tune --profile {tmp}/decode_abc.json --acceptance 0.7", "'abc'"),
    ("tune-max-draft-len-neg", "tune --profile {tmp}/profile.json --acceptance 0.7 --max-draft-len=-1", "-1"),
    ("tune-out-dir", "tune --profile {tmp}/profile.json --acceptance 0.7 --out {tmp}/adir", "is a directory"),
    ("tune-read-only-out", "tune --profile {tmp}/profile.json --acceptance 0.7 --out /proc/self/s.txt",
     "/proc/self/s.txt"),
    ("tune-huge-batch", "tune --profile {tmp}/huge.json --acceptance 0.7", "10000000"),
    # ---- schedule ----
    ("schedule-huge-k", "schedule --spec 4:1000000", "1000000"),
    ("schedule-unicode-digit", ["schedule", "--spec", "\uff14:4"], "\uff14"),
    ("schedule-version-newline", ["schedule", "--spec", "4:4", "--trtllm-version", "1.2.1\n"], "1.2.1"),
    ("schedule-max-batch-0", "schedule --spec 4:4 --max-batch-size 0", "0"),
    # ---- profile ----
    ("profile-read-only-out", "profile --out /proc/self/p.json --batch-sizes 1 --draft-lens 1", "/proc/self/p.json"),
    ("profile-out-dir", "profile --out {tmp}/adir --batch-sizes 1 --draft-lens 1", "is a directory"),
    ("profile-batch-sizes-0", "profile --out {tmp}/p.json --batch-sizes 0 --draft-lens 1", "0"),
    ("profile-out-is-dataset", "profile --out {tmp}/good.jsonl --dataset {tmp}/good.jsonl --measure-acceptance",
     "is --dataset"),
    ("profile-draft-lens-neg", "profile --out {tmp}/p.json --batch-sizes 1 --draft-lens=-1", "-1"),
    # ---- triton ----
    ("triton-out-is-engine", "triton --engine-dir {victim_engine} --out {victim_engine} --force", "--engine-dir"),
    ("triton-out-inside-engine", "triton --engine-dir {victim_engine} --out {victim_engine}/repo --force",
     "--engine-dir"),
    ("triton-read-only-out", "triton --engine-dir {engine} --out /proc/self/repo", "/proc/self/repo"),
    ("triton-missing-engine", "triton --engine-dir {tmp}/nope --out {tmp}/repo", "nope"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tiny HF pair, its conversions and an engine dir, bad checkpoints, prompt files and profiles."""
    root = tmp_path_factory.mktemp("bad")
    hf, eagle = make_llama(root / "hf"), make_eagle3(root / "eagle")
    assert main(["convert", "target", "--hf", str(hf), "--out", str(root / "target"), "--dtype", "float32"]) == 0
    assert main(["convert", "eagle3", "--draft", str(eagle), "--target", str(root / "target"),
                 "--out", str(root / "draft")]) == 0
    assert main(["build", "--target", str(root / "target"), "--draft", str(root / "draft"), "--out",
                 str(root / "engine"), "--schedule", "4:4", "--min-draft-len", "1", "--max-batch-size", "8"]) == 0
    sharded = make_llama(root / "sharded", max_shard_size="60KB")
    shard = sorted(sharded.glob("model-00002-of-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    bad = make_eagle3(root / "eagle_bad")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "target_hidden_size": 128.7}))
    for name, data in PROMPTS.items():
        (root / f"{name}.jsonl").write_bytes(data)
    (root / "adir").mkdir()
    (root / "good.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    table = {str(b): {"0": 1.0 + b, "1": 1.2 + b} for b in (1, 2, 4)}
    (root / "profile.json").write_text(json.dumps({"iteration_ms": table}))
    (root / "decode_abc.json").write_text(json.dumps({"iteration_ms": table, "decode_ms": {"1": "abc"}}))
    (root / "huge.json").write_text(json.dumps({"iteration_ms": {**table, "10000000": {"0": 9.0, "1": 20.0}}}))
    return root


def _argv(world: Path, row_tmp: Path, argv) -> tuple[list[str], list[Path]]:
    """Expand placeholders; {victim*} are fresh copies a row may try to destroy (returned to check)."""
    words = argv.split() if isinstance(argv, str) else list(argv)
    text = "\0".join(words)
    watched = []
    if "{victim}" in text:
        shutil.copytree(world / "hf", row_tmp / "victim" / "hf")
        watched.append(row_tmp / "victim" / "hf")
    if "{victim_target}" in text:
        shutil.copytree(world / "target", row_tmp / "victim_target")
        watched.append(row_tmp / "victim_target")
    if "{victim_engine}" in text:   # a sibling of world/engine, so its relative checkpoint paths hold
        ve = world / f"engine-{row_tmp.name}"
        shutil.copytree(world / "engine", ve)
        watched.append(ve)
        text = text.replace("{victim_engine}", str(ve))
    subs = {"victim": row_tmp / "victim", "victim_target": row_tmp / "victim_target", "tmp": world,
            **{k: world / k for k in ("hf", "eagle", "target", "draft", "engine", "sharded", "eagle_bad")}}
    for k, v in subs.items():
        text = text.replace("{" + k + "}", str(v))
    return text.split("\0"), watched


def _snapshot(paths):
    return {p: sorted((str(f.relative_to(p)), f.stat().st_size) for f in p.rglob("*")) for p in paths}


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_exits_2_with_one_line(world, tmp_path, capsys, row):
    _, argv, must = row
    argv, watched = _argv(world, tmp_path, argv)
    before = _snapshot(watched)
    try:
        rc = main(argv)
    except SystemExit as e:              # argparse's own usage errors are exit 2 with usage + message
        rc = e.code
    except BaseException as e:           # what this table guards against: a traceback, exit 1
        pytest.fail(f"dynspec {' '.join(argv)!r} raised {type(e).__name__}: {e}")
    err = capsys.readouterr().err
    lines = err.strip("\n").splitlines()
    assert rc == 2, f"exit {rc}, stderr {err!r}"
    assert len(lines) == 1, f"{len(lines)} stderr lines: {err!r}"
    assert must in lines[0], f"{must!r} not in {lines[0]!r}"
    assert _snapshot(watched) == before, "an input changed"


@pytest.mark.parametrize("row", [
    ("process-generate-bools", "generate --prompts {tmp}/bools.jsonl", "2:"),
    ("process-tune-decode-ms", "tune --profile {tmp}/decode_abc.json --acceptance 0.7", "'abc'"),
    ("process-build-gpu-mem-nan", "build --target {target} --draft {draft} --schedule 4:4 --gpu-mem-gb nan --plan",
     "nan"),
], ids=lambda r: r[0])
def test_bad_input_in_a_real_process(world, tmp_path, row):
    _, argv, must = row
    argv, _ = _argv(world, tmp_path, argv)
    r = subprocess.run([sys.executable, "-m", "dynspec.cli", *argv], capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip("\n").splitlines()
    assert r.returncode == 2 and len(lines) == 1 and must in lines[0], (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("argv", ["schedule --spec 4:4 --max-batch-size 100000000",
                                  "tune --profile {tmp}/huge.json --acceptance 0.7"])
def test_resource_bombs_end_quickly(world, tmp_path, argv):
    """In tiers or refused, in a subprocess under a timeout (expanded per batch size: minutes at GBs)."""
    argv, _ = _argv(world, tmp_path, argv)
    r = subprocess.run([sys.executable, "-m", "dynspec.cli", *argv], capture_output=True, text=True, timeout=30)
    assert r.returncode in (0, 2) and len(r.stderr.strip("\n").splitlines()) <= 1, r.stderr[-2000:]
