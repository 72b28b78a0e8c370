"""Where a suite run's numbers came from, for its manifest.json: git commit and tree (and the tree
of the files as run, edits included), GPUs and clocks, torch and python versions."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]


def _out(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO,
                           env=None if env is None else {**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def worktree_tree() -> str | None:
    """The git tree of the files as they are (tracked and untracked-not-ignored, edits included),
    through a scratch index: equal to a commit's tree when the run's files are that commit's
    (`git rev-parse COMMIT^{tree}`), whatever HEAD was where it ran. None outside a git checkout."""
    with tempfile.TemporaryDirectory() as d:
        env = {"GIT_INDEX_FILE": str(Path(d) / "index")}
        if _out(["git", "read-tree", "HEAD"], env) is None or _out(["git", "add", "-A"], env) is None:
            return None
        return _out(["git", "write-tree"], env)


def provenance() -> dict:
    """git commit / tree / changed paths / the tree of the files as run, GPU (nvidia-smi, when present), torch and python versions."""
    import platform

    status = _out(["git", "status", "--porcelain"])
    gpu = None
    if shutil.which("nvidia-smi"):
        q = _out(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu",
                  "--format=csv,noheader"])
        gpu = None if q is None else [dict(zip(("name", "clocks_sm", "clocks_max_sm", "clocks_mem", "power_draw",
                                                "temperature"), (x.strip() for x in line.split(","))))
                                      for line in q.splitlines()]
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"git_commit": _out(["git", "rev-parse", "HEAD"]), "git_tree": _out(["git", "rev-parse", "HEAD^{tree}"]),
            "git_changed_paths": None if status is None else len(status.splitlines()),
            "git_worktree_tree": worktree_tree(),
            "gpus": gpu, "torch": torch_version, "python": platform.python_version(), "host": platform.node()}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
