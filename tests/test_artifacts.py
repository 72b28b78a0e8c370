"""atomic_dir / write_text: outputs apart from inputs, stale tmp folders of dead runs removed,
the user's umask honoured (also by the random pairs' writer), unwritable paths a one-line
DynspecError."""
import os
import stat
import subprocess
import sys

import pytest

from dynspec.artifacts import HOST, atomic_dir, check_apart, check_writable, remove_stale, write_json, write_text
from dynspec.errors import DynspecError


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid          # reaped: no process has this PID (until the kernel reuses it)


@pytest.mark.parametrize("out,inp,rel", [
    ("proj", "proj/hf", "contains"),
    ("proj/hf", "proj/hf", "is"),
    ("proj/hf/out", "proj/hf", "lies inside"),
])
def test_out_overlapping_an_input_is_refused_before_anything_is_touched(tmp_path, out, inp, rel):
    src = tmp_path / "proj" / "hf"
    src.mkdir(parents=True)
    (src / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "proj" / "notes.txt").write_text("keep")
    with pytest.raises(DynspecError) as e:
        with atomic_dir(tmp_path / out, force=True, inputs={"--hf": tmp_path / inp, "--draft": None}) as tmp:
            (tmp / "x").write_text("never")
    msg = str(e.value)
    assert f" {rel} --hf " in msg and str(tmp_path / out) in msg and str(tmp_path / inp) in msg
    assert (src / "model.safetensors").read_bytes() == b"weights"
    assert (tmp_path / "proj" / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in (tmp_path / "proj").iterdir()) == ["hf", "notes.txt"]


def test_symlinked_out_into_an_input_is_refused(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "hf")
    with pytest.raises(DynspecError, match="is --target"):
        check_apart(tmp_path / "link", {"--target": tmp_path / "hf"})


def test_sibling_with_common_prefix_is_allowed(tmp_path):
    check_apart(tmp_path / "hf-fp16", {"--hf": tmp_path / "hf"})     # 'hf-fp16' is not inside 'hf'


def test_stale_tmp_of_a_dead_pid_is_removed_live_and_foreign_kept(tmp_path):
    dead, live = _dead_pid(), os.getppid()
    other_host = "000000" if HOST != "000000" else "111111"
    stale = tmp_path / f".eng.tmp-{dead}-{HOST}-abcd1234"
    stale_old = tmp_path / f".eng.old-{dead}-{HOST}-abcd1234"
    running = tmp_path / f".eng.tmp-{live}-{HOST}-abcd1234"
    remote = tmp_path / f".eng.tmp-{dead}-{other_host}-abcd1234"   # another host: its PIDs are not ours
    other = tmp_path / f".other.tmp-{dead}-{HOST}-abcd1234"         # another output's leftover
    legacy = tmp_path / ".eng.tmp-x7q2kz9a"                          # no PID: owner unknown
    for d in (stale, stale_old, running, remote, other, legacy):
        d.mkdir()
        (d / "shard").write_bytes(b"x" * 10)
    with atomic_dir(tmp_path / "eng") as tmp:
        (tmp / "engine.json").write_text("{}")
    assert not stale.exists() and not stale_old.exists()
    assert running.is_dir() and remote.is_dir() and other.is_dir() and legacy.is_dir()
    assert (tmp_path / "eng" / "engine.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".eng.tmp")) == sorted(
        [running.name, remote.name, legacy.name])


def test_stale_json_tmp_file_of_a_dead_pid_is_removed(tmp_path):
    dead = _dead_pid()
    (tmp_path / f".p.json.tmp-{dead}-{HOST}").write_text("half")
    write_json(tmp_path / "p.json", {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]
    assert remove_stale(tmp_path / "p.json") == []


def test_killed_run_leaves_a_tmp_that_the_next_run_removes(tmp_path):
    code = ("import os, sys\nfrom dynspec.artifacts import atomic_dir\n"
            f"with atomic_dir({str(tmp_path / 'eng')!r}) as t:\n"
            "    (t / 'w').write_text('x'); print(t, flush=True); os._exit(9)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    left = [p for p in tmp_path.iterdir()]
    assert r.returncode == 9 and len(left) == 1 and left[0].name.startswith(".eng.tmp-")
    with atomic_dir(tmp_path / "eng") as tmp:
        (tmp / "ok").write_text("1")
    assert [p.name for p in tmp_path.iterdir()] == ["eng"]


def test_outputs_follow_the_umask(tmp_path):
    from safetensors.torch import save_file
    import torch

    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "sub").mkdir()
            save_file({"w": torch.zeros(2)}, str(tmp / "sub" / "w.safetensors"))   # safetensors writes 0600
            (tmp / "run.sh").write_text("#!/bin/sh\n")
            (tmp / "run.sh").chmod(0o700)
        write_json(tmp_path / "p.json", {})
    finally:
        os.umask(old)
    mode = lambda p: oct((tmp_path / p).stat().st_mode & 0o777)  # noqa: E731
    assert mode("out") == mode("out/sub") == oct(0o755)
    assert mode("out/sub/w.safetensors") == mode("p.json") == oct(0o644)
    assert mode("out/run.sh") == oct(0o755)


def test_outputs_follow_a_stricter_umask(tmp_path):
    old = os.umask(0o077)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "f").write_text("x")
    finally:
        os.umask(old)
    assert oct((tmp_path / "out").stat().st_mode & 0o777) == oct(0o700)
    assert oct((tmp_path / "out" / "f").stat().st_mode & 0o777) == oct(0o600)


@pytest.mark.parametrize("where", ["/proc/self/dynspec-out", "FILE/sub"])
def test_unwritable_out_is_one_line(tmp_path, where):
    (tmp_path / "FILE").write_text("a file, not a folder")
    out = where.replace("FILE", str(tmp_path / "FILE"))
    for attempt in (lambda: atomic_dir(out).__enter__(), lambda: write_text(out + "/x.txt", "x"),
                    lambda: check_writable(out + "/x.jsonl")):
        with pytest.raises(DynspecError, match="cannot be (created|written)") as e:
            attempt()
        msg = str(e.value)
        assert "\n" not in msg and ("/proc/self/dynspec-out" in msg or str(tmp_path / "FILE") in msg)


def test_directory_named_as_a_file_output_is_refused(tmp_path):
    with pytest.raises(DynspecError, match="is a directory"):
        write_text(tmp_path, "4:4\n")
    with pytest.raises(DynspecError, match="is a directory"):
        check_writable(tmp_path)


def test_random_pair_follows_umask_077(tmp_path):
    from dynspec.pairs.random_pair import write_random_pair

    old = os.umask(0o077)
    try:
        pair = write_random_pair(tmp_path / "pair", preset="tiny", seed=1)
    finally:
        os.umask(old)
    root = pair.target.parent
    paths = [root, *root.rglob("*")]
    files = [p for p in paths if p.is_file()]
    assert files and any(p.suffix == ".safetensors" for p in files)
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
    assert {stat.S_IMODE(p.stat().st_mode) for p in paths if p.is_dir()} == {0o700}
