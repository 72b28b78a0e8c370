"""ENGINE_DIR/llm_api_options.yaml (OPTIONS_FILE), read: the one reader of the TRT-LLM LLM-API
options file that `dynspec build` writes (build/llm_api.py renders it, build/engine_dir.py writes
it), shared by every stage that opens it: the TRT-LLM engine (runtime/engines/trtllm.py), the
Triton repository generator (triton_repo/generate.py) and the benchmark driver
(benchmarks/trtllm_driver.py).

It owns the file's name, the draft checkpoint's key in speculative_config (DRAFT_KEY, and
DRAFT_KEYS, every name TRT-LLM takes for it) and read_options, which parses the file into the
mapping of LLM() arguments.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from dynspec.errors import DynspecError

OPTIONS_FILE = "llm_api_options.yaml"
# The draft checkpoint's key in speculative_config. TRT-LLM PR 10099 renamed the field to
# speculative_model and kept speculative_model_dir as a validation alias; before it only
# speculative_model_dir exists. So speculative_model_dir is valid on either side of the PR, and
# a config never holds both (extra='forbid' rejects the pair). docs/design.md, section 2.
DRAFT_KEY = "speculative_model_dir"
DRAFT_KEYS = ("speculative_model_dir", "speculative_model")


def read_options(path: str | Path) -> dict:
    """Parse an LLM-API options YAML; a missing, unparseable or non-mapping file names itself."""
    path = Path(path)
    if not path.is_file():
        raise DynspecError(f"LLM API options {path} do not exist")
    try:
        obj = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise DynspecError(f"{path} is not valid YAML: {e}") from e
    if not isinstance(obj, dict):
        raise DynspecError(f"{path} must hold a YAML mapping of LLM() arguments, not {type(obj).__name__}")
    return obj
