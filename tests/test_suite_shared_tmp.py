"""The suite's paths in shared places (benchmarks/suite_paths.py): a failed run's partial outputs
and the default work dir live in TMPDIR/dynspec-<uid>/ (this user's, mode 0700, no link
followed); a link planted there, or a folder or engine another user owns, is refused in one line
naming the path and the owner, and nothing is written where that user chose. Also one line for a
non-UTF-8 config and for an --out-root that is a file.

Tests that need a folder of another uid make one chowned to 65534 and run only as root (as CI
does); elsewhere they skip saying so."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from dynspec.benchmarks import suite
from dynspec.benchmarks.suite_config import load_config
from dynspec.benchmarks.suite_paths import private_dir, user_name
from dynspec.benchmarks.suite_stages import prepare
from dynspec.errors import DynspecError

OTHER = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder owned by another uid"
                                                       " (CI runs as root)")

RANDOM_TOML = """figures = "cost_model"
budget_s = 60
[engine]
pair = "random"
preset = "tiny"
device = "cpu"
tp = 1
[[stages]]
name = "profile"
tool = "profile"
install = "cost_model.json"
[[stages]]
name = "tune"
tool = "tune"
[stages.args]
profile = "{cost_model}"
acceptance = 0.5
"""


@pytest.fixture
def tmpdir_(tmp_path, monkeypatch) -> Path:
    """A TMPDIR of the test's own: tempfile.gettempdir() answers it."""
    t = tmp_path / "tmp"
    t.mkdir(mode=0o1777)
    os.chmod(t, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(t))
    return t


def chown_tree(path: Path, uid: int = OTHER) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, uid, uid)


def failing_run(monkeypatch, tmp_path: Path):
    """cpu_tiny under a stand-in checkout's benchmarks/results, its stage failing at once."""
    def run_stages(stages, budget_s, logs, bar=None, installed=None):
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "sweep.log").write_text("error: boom\n")
        return [], "stage 'sweep' failed with rc 2 (log: logs/sweep.log): error: boom"

    checkout = tmp_path / "checkout"
    out = checkout / "benchmarks" / "results"
    out.mkdir(parents=True)
    monkeypatch.setattr(suite, "REPO", checkout)
    monkeypatch.setattr(suite, "run_stages", run_stages)
    with pytest.raises(DynspecError) as e:
        suite.run_config(load_config("cpu_tiny"), tmp_path / "work", out, "test")
    return str(e.value), out


def plant(tmpdir_: Path, victim: Path, kind: str) -> list[Path]:
    """At the private root's name and at the shared name an older suite used: a link to `victim`
    or a world-writable folder. -> the places planted."""
    spots = [tmpdir_ / f"dynspec-{os.getuid()}", tmpdir_ / "dynspec_incomplete"]
    for s in spots:
        if kind == "link":
            s.symlink_to(victim, target_is_directory=True)
        else:
            s.mkdir()
            os.chmod(s, 0o777)
    return spots


def test_a_failed_run_refuses_a_link_at_its_private_folder(tmpdir_, tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.mkdir()
    plant(tmpdir_, victim, "link")
    msg, out = failing_run(monkeypatch, tmp_path)
    mine = tmpdir_ / f"dynspec-{os.getuid()}"
    assert msg == (f"config cpu_tiny: stage 'sweep' failed with rc 2 (log: logs/sweep.log): error: boom; partial"
                   f" outputs kept in {out / '.cpu_tiny.partial'}, since private temp folder {mine} is a symbolic"
                   f" link (to {victim}), owned by {user_name(os.getuid())}; refusing to follow it"), msg
    assert list(victim.iterdir()) == []
    assert (out / ".cpu_tiny.partial" / "logs" / "sweep.log").is_file()


@as_root
@pytest.mark.parametrize("kind", ["link", "folder"])
def test_a_failed_run_writes_nothing_where_another_user_chose(tmpdir_, tmp_path, monkeypatch, kind):
    victim = tmp_path / "victim"
    victim.mkdir()
    spots = plant(tmpdir_, victim, kind)
    chown_tree(victim)
    for s in spots:
        os.lchown(s, OTHER, OTHER)
    msg, out = failing_run(monkeypatch, tmp_path)
    mine = spots[0]
    why = (f"is a symbolic link (to {victim}), owned by uid {OTHER}" if kind == "link" else
           f"is owned by uid {OTHER}")
    assert f"since private temp folder {mine} {why}" in msg and "\n" not in msg, msg
    assert user_name(OTHER) in msg
    for d in (victim, *spots):
        assert list(d.iterdir()) == [], d
    assert (out / ".cpu_tiny.partial" / "manifest.json").is_file()


def test_the_default_work_dir_is_private(tmpdir_, tmp_path, capsys):
    (tmp_path / "r.toml").write_text(RANDOM_TOML)
    work = tmpdir_ / f"dynspec-{os.getuid()}" / "suite"
    assert suite.make_parser().parse_args(["cpu_tiny"]).work == str(work)
    assert suite.main([str(tmp_path / "r.toml"), "--dry-run", "--out-root", str(tmp_path / "out")]) == 0
    assert f"{work}/random-tiny-tp1-" in capsys.readouterr().out
    for d in (work.parent, work):
        assert d.stat().st_mode & 0o777 == 0o700 and d.stat().st_uid == os.getuid(), d


def test_the_default_work_dir_refuses_a_planted_link(tmpdir_, tmp_path, capsys):
    (tmp_path / "r.toml").write_text(RANDOM_TOML)
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in (f"dynspec-{os.getuid()}", "dynspec_suite"):
        (tmpdir_ / name).symlink_to(victim, target_is_directory=True)
    assert suite.main([str(tmp_path / "r.toml"), "--dry-run", "--out-root", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tmpdir_ / f'dynspec-{os.getuid()}'} is a symbolic link (to {victim})" in err[0], err
    assert list(victim.iterdir()) == []


def planted_engine(work: Path) -> Path:
    """WORK/<key>/ of RANDOM_TOML's engine, prepared as far as `prepare` can tell."""
    spec = load_config(str(work.parent / "r.toml")).engine
    root = work / spec.key()
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "engine.json").write_text("{}")
    (root / "prepared.json").write_text(json.dumps({"spec": spec.prepared(), "commands": []}))
    return root


def test_an_engine_of_ones_own_is_reused(tmp_path):
    (tmp_path / "r.toml").write_text(RANDOM_TOML)
    root = planted_engine(tmp_path / "work")
    info = prepare(load_config(str(tmp_path / "r.toml")).engine, tmp_path / "work", tmp_path / "logs")
    assert info["reused"] is True and info["engine_dir"] == str(root / "engine")


@as_root
@pytest.mark.parametrize("whose", ["work", "engine tree", "engine.json", "prepared.json"])
def test_a_work_dir_or_engine_of_another_user_is_refused(tmp_path, capsys, whose):
    (tmp_path / "r.toml").write_text(RANDOM_TOML)
    work = tmp_path / "work"
    root = planted_engine(work)
    target, what = {"work": (work, "work dir"), "engine tree": (root, "prepared engine"),
                    "engine.json": (root / "engine" / "engine.json", "prepared engine"),
                    "prepared.json": (root / "prepared.json", "prepared engine")}[whose]
    chown_tree(target)                      # a file: itself alone
    line = (f"{what} {target} is owned by {user_name(OTHER)}, not by you ({user_name(os.getuid())});"
            " refusing it (remove it or choose another path)")
    args = [str(tmp_path / "r.toml"), "--work", str(work), "--out-root", str(tmp_path / "out")]
    for extra in (["--dry-run"], ["--prepare-only"], ["--no-progress"]):
        assert suite.main(args + extra) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"dynspec suite: error: {line}"], (extra, err)
    with pytest.raises(DynspecError) as e:
        prepare(load_config(str(tmp_path / "r.toml")).engine, work, tmp_path / "logs")
    assert str(e.value) == f"prepare: {line}"
    assert not (tmp_path / "out").exists() and not (tmp_path / "logs").exists()


def test_a_link_to_another_users_engine_is_refused_too(tmp_path):
    """A link of one's own that points at a folder another user owns is that user's folder."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a folder owned by another uid (CI runs as root)")
    (tmp_path / "r.toml").write_text(RANDOM_TOML)
    theirs = planted_engine(tmp_path / "theirs")
    chown_tree(theirs)
    work = tmp_path / "work"
    work.mkdir()
    (work / theirs.name).symlink_to(theirs, target_is_directory=True)
    with pytest.raises(DynspecError, match=rf"prepared engine {work / theirs.name} is owned by uid {OTHER}"):
        prepare(load_config(str(tmp_path / "r.toml")).engine, work, tmp_path / "logs")


def test_a_private_folder_of_ones_own_is_tightened_and_a_dangling_link_refused(tmp_path):
    d = tmp_path / "mine"
    d.mkdir(mode=0o755)
    assert private_dir(d) == d and d.stat().st_mode & 0o777 == 0o700
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(DynspecError, match=r"dangling is a symbolic link \(to .*nowhere\)"):
        private_dir(tmp_path / "dangling")
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(DynspecError, match=r"private folder .*file is not a folder this user can open: Not a directory"):
        private_dir(tmp_path / "file")


# ---- one line for a bad config file or --out-root ----------------------------------------------
def test_a_non_utf8_config_is_one_line(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_bytes(b'figures = "sweep"\ndescription = "caf\xe9"\n')
    assert suite.main([str(p), "--out-root", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"dynspec suite: error: config {p}: not UTF-8 text (byte 36)"]


@pytest.mark.parametrize("under", [False, True])
def test_an_out_root_that_is_a_file_is_one_line(tmp_path, capsys, under):
    f = tmp_path / "results"
    f.write_text("not a folder")
    out = f / "deeper" if under else f
    assert suite.main(["cpu_tiny", "--out-root", str(out), "--no-progress", "--work", str(tmp_path / "w")]) == 2
    which = f"lies under {f}, which is" if under else "is"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"dynspec suite: error: --out-root {out} {which} a file, not a folder"]
    assert f.read_text() == "not a folder"


def test_run_config_names_an_out_root_it_cannot_make(tmp_path):
    f = tmp_path / "results"
    f.write_text("x")
    with pytest.raises(DynspecError, match=rf"^--out-root {f}: cannot make {f}/\.cpu_tiny\.partial: Not a directory$"):
        suite.run_config(load_config("cpu_tiny"), tmp_path / "w", f, "test")
