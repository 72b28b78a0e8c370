"""A model repository, checked before tritonserver loads it, and the integer inputs its
config.pbtxt files declare."""
from __future__ import annotations

import os
import re
from pathlib import Path

from dynspec.errors import DynspecError


def check_repo(repo: str | os.PathLike) -> None:
    """Refuse, before tritonserver starts, a reference repository whose model load would fail
    inside tritonserver with a Python traceback: its engine dir missing or moved (or its
    target / draft checkpoint gone), or its device absent from this machine (device cuda on a
    build of torch without CUDA, or with no GPU; cuda:N beyond the GPUs there are). The engine dir
    and device are dynspec_repo.json's, which `dynspec triton` wrote with config.pbtxt's."""
    from dynspec.artifacts import read_json
    from dynspec.triton_repo.generate import REPO_MANIFEST, open_engine

    path = Path(repo) / REPO_MANIFEST
    if not path.is_file():
        return                              # a repository of one's own: tritonserver reports its load
    manifest = read_json(path, "repository manifest")
    if manifest.get("variant") != "reference":
        return
    engine_dir, device = manifest.get("engine_dir"), manifest.get("device")
    if not isinstance(engine_dir, str) or not isinstance(device, str):
        raise DynspecError(f"{path}: fields 'engine_dir' and 'device' must be strings, not {engine_dir!r} and "
                           f"{device!r}; regenerate the repository with `dynspec triton`")
    try:
        open_engine(engine_dir)
    except DynspecError as e:
        raise DynspecError(f"{path}: the engine dir cannot be served: {str(e).splitlines()[0]}; rebuild it there "
                           "or regenerate the repository with `dynspec triton --engine-dir`") from None
    if device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or 0)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            have = "no CUDA device" if count == 0 else f"{count} CUDA device(s)"
            build = "without CUDA" if torch.version.cuda is None else f"with CUDA {torch.version.cuda}"
            raise DynspecError(f"{path}: device {device} for engine dir {engine_dir}, but this machine has {have} "
                               f"(torch {torch.__version__}, built {build}); serve it on a machine with that GPU, "
                               f"or regenerate the repository with `dynspec triton --device cpu`")


def integer_inputs(repo: str | os.PathLike) -> dict[str, str]:
    """Input name -> Triton datatype of every integer input declared in the repository's
    config.pbtxt files, e.g. {"max_tokens": "INT32", "seed": "UINT64"} (what the HTTP front checks)."""
    out = {}
    for config in sorted(Path(repo).glob("*/config.pbtxt")):
        text = config.read_text(errors="replace")
        for name, kind in re.findall(r'name:\s*"([^"]+)"\s*data_type:\s*TYPE_((?:U?INT)\d+)', text):
            out[name] = kind
    return out
