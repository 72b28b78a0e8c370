"""Hostile `trace:PATH` files (runtime/policy/acceptance_trace.read_trace, reached by `--acceptance
trace:PATH` through runtime/policy/acceptance.parse_acceptance): a FIFO, /dev/zero, a directory, a file
past the size cap, a small file whose padded table would be huge, non-UTF-8 bytes and deep
nesting. Each is one DynspecError line naming the file, before any large read or allocation.
The reads that could hang or exhaust memory run in a child process under a time and memory limit,
so a reader that blocks or reads without bound fails the test instead of stalling it."""
import json
import os
import subprocess
import sys

import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.policy import acceptance_trace
from dynspec.runtime.policy.acceptance_trace import FORMAT, MAX_FILE_BYTES, MAX_TABLE_BYTES, Trace, read_trace

CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import parse_acceptance
try:
    parse_acceptance("trace:" + sys.argv[1])
except DynspecError as e:
    print("refused:", e)
else:
    print("accepted")
"""


def one_line_in_child(path) -> str:
    """parse_acceptance('trace:PATH') in a child limited to 2 GiB and 60 s -> its one output line."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                           timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading trace:{path} did not return within 60 s")
    out = p.stdout.strip().splitlines()
    assert p.returncode == 0 and len(out) == 1, (p.returncode, p.stdout, p.stderr[-2000:])
    return out[0]


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    line = one_line_in_child(fifo)
    assert line.startswith("refused: ") and line.endswith(f" {fifo}: is a FIFO; an acceptance trace must be a"
                                                         " regular file"), line


def test_dev_zero_is_refused_without_reading():
    line = one_line_in_child("/dev/zero")
    assert line.startswith("refused: ") and line.endswith(" /dev/zero: is a device; an acceptance trace must be"
                                                         " a regular file"), line


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(DynspecError) as e:
        read_trace(tmp_path)
    assert str(e.value) == f"{tmp_path}: is a directory; an acceptance trace must be a regular file"


def test_a_file_past_the_size_cap_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:                    # sparse: no disk used
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(DynspecError) as e:
        read_trace(big)
    assert str(e.value) == (f"{big}: {MAX_FILE_BYTES + 1} bytes; an acceptance trace may hold at most"
                            f" {MAX_FILE_BYTES}")


def huge_table_trace(path, n_short: int, long_len: int):
    """n_short one-offset requests and one of long_len offsets: a small file, an n x long_len table."""
    with open(path, "w") as f:
        f.write(json.dumps({"format": FORMAT, "source": {}, "kmax": 1})[:-1] + ', "requests": [')
        f.write("[" + ",".join(["0"] * long_len) + "]")
        f.write(",[0]" * n_short + "]}")


def test_a_small_file_asking_for_a_huge_table_is_refused_in_the_child(tmp_path):
    """About 2.4 MB asking for 400001 x 240000 bytes (89 GiB): refused while read, in a child whose
    address space could not hold that table."""
    p = tmp_path / "t.json"
    huge_table_trace(p, 400_000, 240_000)
    assert os.path.getsize(p) < 2_600_000
    line = one_line_in_child(p)
    assert line.startswith("refused: ") and line.endswith(
        f" {p}: 400001 requests padded to the longest (240000 offsets) make a {400001 * 240000}-byte table;"
        f" at most {MAX_TABLE_BYTES} (split the trace)"), line


def test_the_table_cap_is_exact(tmp_path, monkeypatch):
    monkeypatch.setattr(acceptance_trace, "MAX_TABLE_BYTES", 12)
    t = Trace(2, ((1, 0, 2, 1), (0,), (2, 2)))                  # 3 requests x 4 offsets = 12 bytes
    assert t.table.shape == (3, 4) and t.table.nbytes == 12
    with pytest.raises(DynspecError, match=r"^trace: 4 requests padded to the longest \(4 offsets\) make a"
                                           r" 16-byte table; at most 12 \(split the trace\)$"):
        Trace(2, ((1, 0, 2, 1), (0,), (2, 2), (1,)))
    p = tmp_path / "t.json"
    huge_table_trace(p, 3, 4)                                    # 4 x 4 = 16 bytes
    with pytest.raises(DynspecError, match=r"t\.json: 4 requests padded .* 16-byte table; at most 12"):
        read_trace(p)


@pytest.mark.parametrize("data, says", [
    (b'{"format": "\xff\xfe"}', "not UTF-8 text (byte 12)"),
    (b"\x80" + b"[0]" * 10, "not UTF-8 text (byte 0)"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON (nested too deeply)"),
])
def test_bytes_that_are_not_text_or_json_are_one_line(tmp_path, data, says):
    p = tmp_path / "t.json"
    p.write_bytes(data)
    with pytest.raises(DynspecError) as e:
        read_trace(p)
    assert str(e.value) == f"{p}: {says}"


def test_a_long_bad_value_is_quoted_short(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"format": "x" * 100_000, "source": {}, "kmax": 1, "requests": [[0]]}))
    with pytest.raises(DynspecError) as e:
        read_trace(p)
    assert len(str(e.value)) < len(str(p)) + 120 and "'xxx" in str(e.value), str(e.value)


def test_a_link_to_a_regular_trace_is_read(tmp_path):
    p = tmp_path / "t.json"
    huge_table_trace(p, 2, 3)
    (tmp_path / "link.json").symlink_to(p)
    assert read_trace(tmp_path / "link.json").table.shape == (3, 3)
