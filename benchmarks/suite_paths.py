"""The suite's folders in shared places, and whose they are.

    TMPDIR/dynspec-<uid>/              private_root(): mode 0700, owned by this user, never a link
        suite/                         the default --work (prepared engines)
        incomplete/NAME.incomplete     a failed config's partial outputs when OUT_ROOT lies in the checkout

Every folder on the way is opened with O_NOFOLLOW and checked by fstat: a symbolic link, a
non-folder, or a folder another user owns is refused in one line naming the path and its owner,
so no other local user can choose where the suite writes or which engine it measures. A work dir
the user names (--work) is not made private, but it and the engine in it must be this user's
(`check_owned`).
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable

from dynspec.errors import DynspecError


def user_name(uid: int) -> str:
    """'uid 65534 (nobody)', or 'uid 4242' where the password database has no name for it."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _not_yours(path: Path, uid: int, what: str) -> DynspecError:
    return DynspecError(f"{what} {path} is owned by {user_name(uid)}, not by you ({user_name(os.getuid())});"
                        " refusing it (remove it or choose another path)")


def private_dir(path: str | os.PathLike, what: str = "private folder") -> Path:
    """`path` as a folder of this user's, mode 0700: made if absent; a symbolic link, a
    non-folder or another user's folder is refused. Its parent must already be safe (TMPDIR,
    sticky, or a private_dir)."""
    p = Path(path)
    try:
        os.mkdir(p, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise DynspecError(f"{what} {p}: cannot create it: {e.strerror or e}") from None
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if os.path.islink(p):
            raise DynspecError(f"{what} {p} is a symbolic link (to {os.readlink(p)}), owned by"
                               f" {user_name(os.lstat(p).st_uid)}; refusing to follow it") from None
        raise DynspecError(f"{what} {p} is not a folder this user can open: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise _not_yours(p, st.st_uid, what)
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return p


def private_root() -> Path:
    """TMPDIR/dynspec-<uid>, checked (private_dir)."""
    return private_dir(Path(tempfile.gettempdir()) / f"dynspec-{os.getuid()}", "private temp folder")


def default_work() -> Path:
    """The default --work: TMPDIR/dynspec-<uid>/suite (not created here)."""
    return Path(tempfile.gettempdir()) / f"dynspec-{os.getuid()}" / "suite"


def private_work(work: Path) -> None:
    """Make the default work dir and the private root above it, checked; any other work dir is
    left to the user (check_owned still applies to it)."""
    if Path(work) == default_work():
        private_dir(private_root() / "suite", "work dir")


def incomplete_root() -> Path:
    """TMPDIR/dynspec-<uid>/incomplete, checked."""
    return private_dir(private_root() / "incomplete", "folder for incomplete outputs")


def check_owned(paths: Iterable[str | os.PathLike], what: str) -> None:
    """Refuse any of `paths` that exists and is owned by another user, as a link or as what it
    points to; absent paths pass."""
    me = os.getuid()
    for path in paths:
        p = Path(path)
        for follow in (False, True):
            try:
                st = os.stat(p, follow_symlinks=follow)
            except OSError:
                continue
            if st.st_uid != me:
                raise _not_yours(p, st.st_uid, what)


def check_out_root(out_root: Path) -> None:
    """--out-root must be a folder or absent (then made): a file, or a file on its way, is one line."""
    for p in (out_root, *out_root.parents):
        if p.exists() and not p.is_dir():
            which = "is" if p == out_root else f"lies under {p}, which is"
            raise DynspecError(f"--out-root {out_root} {which} a file, not a folder")
