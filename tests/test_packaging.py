"""The package setuptools builds: every folder of code or data is declared, so `pip install`
is quiet, and the data the kit needs at run time (the tiny pair, Triton templates, benchmark
scripts) is in the wheel."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_build_declares_every_folder_and_ships_the_data(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", "import setuptools; setuptools.setup()", "egg_info", "--egg-base", str(tmp_path),
         "build_py", "--build-lib", str(tmp_path / "lib")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout + run.stderr
    absent = [line for line in out.splitlines() if "absent from the `packages` configuration" in line]
    assert not absent, absent
    lib = tmp_path / "lib" / "dynspec"
    for rel in ["checkpoint/tensor_reader.py", "corpus.py", "pairs/tiny_pair.py", "runtime/engines/reference/load.py",
                "assets/tiny/build_info.json", "assets/tiny/target/model.safetensors",
                "assets/tiny/target/tokenizer.json", "assets/tiny/draft/config.json",
                "triton_repo/templates/reference/dynspec/config.pbtxt",
                "triton_repo/templates/reference/dynspec/1/model.py",
                "triton_repo/templates/trtllm_llmapi/tensorrt_llm/config.pbtxt",
                "triton_repo/templates/trtllm_llmapi/tensorrt_llm/1/model.yaml",
                "triton_repo/templates/trtllm_llmapi/launch_triton.sh", "benchmarks/configs/cpu_tiny.toml"]:
        assert (lib / rel).is_file(), rel
