"""The launcher CLI over a crash at any moment, and the serving guide's server block pasted as it is.

Both run the real `tritonserver` on the tiny pair's repository (the serving guide's chain, built
once for the module by test_triton_launcher's fixtures)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_triton_launcher import alive, chain, children, port_free, read_until, repo, start  # noqa: F401
from dynspec.triton_repo.ports import free_ports


def test_a_crash_during_the_start_check_is_restarted_with_a_backoff(repo):
    """tritonserver crashes once it served, then again while the launcher waits for it to be
    ready: the launcher says so in one line each time (the second after a backoff) and serves
    again (it used to stop for good on a crash in its start check)."""
    import urllib.request

    ports = free_ports()
    proc = start(repo, ports)
    try:
        ok, _ = read_until(proc.stdout, "tritonserver ready", 150)
        assert ok
        first = [p for p in children(proc.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "tritonserver"]
        os.kill(first[0], signal.SIGSEGV)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:       # the next tritonserver, killed before it is ready
            found = [p for p in children(proc.pid) if p not in first and alive(p)
                     and Path(f"/proc/{p}/comm").read_text().strip() == "tritonserver"]
            if found:
                os.kill(found[0], signal.SIGSEGV)
                break
            time.sleep(0.02)
        else:
            pytest.fail("no second tritonserver started")
        ok, lines = read_until(proc.stdout, "tritonserver ready", 150)
        assert ok and proc.poll() is None, lines
        body = json.dumps({"input_ids": [5, 6, 7], "max_tokens": 2}).encode()
        with urllib.request.urlopen(f"http://127.0.0.1:{ports.http}/v2/models/dynspec/generate", body, 60) as r:
            assert len(json.loads(r.read())["output_ids"]) == 2
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = err.decode().strip().splitlines()
    assert lines == ["error: tritonserver exited with signal 11; restarting it (restart 1)",
                     "error: tritonserver exited with signal 11 before it was ready; restarting it in 1 s "
                     "(restart 2)"], lines
    assert proc.returncode == 0 and children(proc.pid) == set()


def test_the_guides_server_block_works_pasted_as_one_block(tmp_path):
    """The serving guide's first block, pasted into bash as it is: its curl waits for the server
    (it used to run before the server was ready and print nothing), answers, and the server stops."""
    if not port_free(8000) or not port_free(8001) or not port_free(8002):
        pytest.skip("the guide's block serves on ports 8000-8002, which are in use here")
    text = (Path(__file__).resolve().parents[1] / "docs/serving_with_triton.md").read_text()
    section = text.split("### From the embedded tiny pair to a serving Triton", 1)[1]
    block = re.search(r"^```bash\n(.*?)^```", section, re.S | re.M).group(1)
    assert "python -m dynspec.triton_repo.server" in block and "curl " in block
    proc = subprocess.run(["bash", "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    reply = re.search(r'\{"model_name":"dynspec".*?"output_ids":\[([\d,]*)\]', proc.stdout)
    assert proc.returncode == 0 and reply and len(reply.group(1).split(",")) == 16, proc.stdout[-2000:]
