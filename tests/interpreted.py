"""Run a test helper under Triton's interpreter, in a process of its own: the interpreter must be
on before Triton is first imported (kernels call Triton's own jitted helpers, tl.sum among them)."""
from __future__ import annotations


def interpreted(module: str, fn: str) -> str:
    """tests.<module>.fn() with TRITON_INTERPRET=1 -> its stdout; fails with its output otherwise."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", f"from tests.{module} import {fn}; {fn}()"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    return r.stdout
