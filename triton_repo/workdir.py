"""A launch's private folder in the temp dir (the python backend's directory, the server log),
and the removal of those that outlived their launcher.

    dynspec-triton-<launcher pid>-<random>/
        .lock            flock'd (LOCK_EX) by the launcher and by the tritonserver it started
        backends/        the python backend with the launch's stub
        tritonserver.log

A launcher that dies before its server has stopped (SIGKILL, or mpirun's SIGKILL a second after
its SIGTERM) cannot remove its folder. The lock tells a stale folder from a live one: the kernel
drops it when the last process holding it ends, whatever killed it, in any pid namespace that
shares the temp dir, and a reused pid cannot hold it.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

WORKDIR_PREFIX = "dynspec-triton-"
LOCK = ".lock"


def make_workdir() -> tuple[Path, int]:
    """(a fresh private folder, the fd that holds its lock): first removes the stale folders.
    The lock file is locked before it takes its name, so no sweep can lock a live folder's.
    Pass the fd to the server (Popen pass_fds); discard() removes the folder, then closes it."""
    remove_stale_workdirs()
    d = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
    fd = os.open(d / f"{LOCK}.new", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(d / f"{LOCK}.new", d / LOCK)
    return d, fd


def remove_stale_workdirs(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove this user's private folders under root (default: the temp dir) whose lock no
    process holds; returns them. A folder of another user, a link, and one with no lock file
    (being made, or not a launch's) are left alone."""
    removed = []
    for d in Path(root or tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            st = d.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(d / LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:                       # held: a live launcher or its server
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)
        if not d.exists():
            removed.append(d)
    return removed


def discard(d: Path, fd: int | None) -> None:
    """Remove the launch's own folder, then close its hold on the lock (fd None: already closed)."""
    shutil.rmtree(d, ignore_errors=True)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
