"""Write artifacts all-or-nothing: build in a temporary sibling folder, rename into place.

    out = proj/engine
    proj/.engine.tmp-4242-9f3a1c-5be0d2aa/   written by PID 4242 on host 9f3a1c (hash of the hostname);
                                             renamed to proj/engine on success
    proj/.engine.old-4242-9f3a1c-5be0d2aa/   the replaced folder, removed right after the rename
A run killed with -9 leaves its tmp folder behind; the next write of the same `out` removes
every `.engine.tmp-PID-HOST-*` / `.engine.old-PID-HOST-*` sibling of this host whose PID is not
alive, and nothing else (another host's PIDs cannot be checked, so its folders are kept).
Outputs get the user's umask (022 -> dirs 0755, files 0644, executables 0755), whatever the
library that wrote a file chose (safetensors writes 0600).

--force replaces only a folder an earlier run of the same command wrote, as its manifest says:
    mark=("dynspec.json", {"kind": "target"})   proj/engine/dynspec.json must hold kind "target"
    no mark                                     every top-level JSON manifest of the new output
                                                (engine.json, dynspec_repo.json, ...) must be in the
                                                old one with the same 'format' / 'kind' / 'generator';
                                                an output without one must find its top-level names
A regular file, a device node, a FIFO or a symbolic link named as `out` is refused, force or not.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
from pathlib import Path
from typing import Iterator, Mapping

from dynspec.errors import DynspecError

Inputs = Mapping[str, "str | os.PathLike | None"]   # {"--hf": "proj/hf", "--draft": None (not given)}
Mark = "tuple[str, Mapping[str, str]]"               # ("dynspec.json", {"kind": "target"})
IDENTITY = ("format", "kind", "generator")           # manifest fields that name the command that wrote it
HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]


class OutputError(DynspecError, OSError):
    """An output that cannot be written (a full disk, `ulimit -f`): one line at the CLI, like any
    DynspecError, and still an OSError to callers that handle those."""


def owner_tag() -> str:
    """'PID-HOST' of this process, e.g. '4242-9f3a1c': what remove_stale reads back."""
    return f"{os.getpid()}-{HOST}"


def check_apart(out: str | os.PathLike, inputs: Inputs, out_flag: str = "--out") -> None:
    """Refuse an output that equals, contains or lies inside an input (after resolving links).

    check_apart("proj", {"--hf": "proj/hf"}) -> DynspecError: --out proj contains --hf proj/hf"""
    o = _resolve(out, out_flag)
    for flag, path in inputs.items():
        if path is None:
            continue
        i = _resolve(path, flag)
        if o == i:
            rel = "is"
        elif i.is_relative_to(o):
            rel = "contains"
        elif o.is_relative_to(i):
            rel = "lies inside"
        else:
            continue
        raise DynspecError(f"{out_flag} {out} {rel} {flag} {path}; write the output apart from the inputs")


def _resolve(path: str | os.PathLike, flag: str) -> Path:
    """Path(path).resolve(); a symbolic link loop is a one-line DynspecError naming `flag`."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as e:      # Python 3.11: RuntimeError("Symlink loop from ...")
        raise DynspecError(f"{flag} {path} cannot be resolved (a symbolic link loop?): {e}") from None


def check_writable(path: str | os.PathLike, what: str = "--out", folder: bool = False) -> None:
    """Fail now, not after the work: `path` (a file name, or with folder=True an output folder)
    must be creatable in a writable parent. A directory given for a file, a file-as-parent or a
    read-only filesystem -> one-line DynspecError."""
    path = Path(path)
    if path.is_dir() and not folder:
        raise DynspecError(f"{what} {path} is a directory; give a file name")
    probe = path.parent / f".{path.name}.probe-{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise DynspecError(f"{what} {path} cannot be written: {e.strerror or e}") from None


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _apply_umask(root: Path) -> None:
    """dirs and executables -> 0777 & ~umask, other files -> 0666 & ~umask."""
    mask = _umask()
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        full = 0o777 if p.is_dir() or mode & 0o111 else 0o666
        p.chmod(full & ~mask)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # someone else's live process
        return True
    return True


def remove_stale(out: str | os.PathLike) -> list[Path]:
    """Remove `.OUT.tmp-PID-HOST[-x]` / `.OUT.old-PID-HOST[-x]` siblings of `out` made on this host
    by a PID that is dead; return them. A live PID's folder, another host's, other names and
    other outputs' leftovers are never touched."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    pat = re.compile(rf"^\.{re.escape(out.name)}\.(?:tmp|old)-(\d+)-([0-9a-f]{{6}})(?:-[0-9a-f]+)?$")
    removed = []
    for p in out.parent.iterdir():
        m = pat.match(p.name)
        if not m or m.group(2) != HOST or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _kind_of(path: Path) -> str | None:
    """'a regular file' / 'a symbolic link' / ... for anything at `path` but a real folder; None
    for a folder or nothing."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise DynspecError(f"output folder {path} cannot be examined: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        return None
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISREG, "a regular file"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a folder"


def _manifest(path: Path) -> dict | None:
    """A JSON object file's content, or None (absent, a link, not JSON, not an object)."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        obj = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _check_mark(out: Path, mark: Mark) -> None:
    """`out` holds manifest mark[0] with every field of mark[1], else DynspecError."""
    name, fields = mark
    m = _manifest(out / name)
    if m is None:
        raise DynspecError(f"output folder {out} has no {name}, so no earlier run of this command wrote it; "
                           "--force replaces only such a folder: remove it yourself or choose another --out")
    for key, want in fields.items():
        if m.get(key) != want:
            raise DynspecError(f"output folder {out} was written by another command ({name} field {key!r} is "
                               f"{m.get(key)!r}, this command writes {want!r}); --force will not replace it")


def _same_command(out: Path, new: Path) -> None:
    """The old `out` is what an earlier run of the command now writing `new` wrote (module doc)."""
    marks = [(p.name, {k: m[k] for k in IDENTITY if k in m}) for p in sorted(new.iterdir())
             if p.suffix == ".json" and (m := _manifest(p)) is not None and any(k in m for k in IDENTITY)]
    for mark in marks:
        _check_mark(out, mark)
    if not marks:
        missing = sorted(p.name for p in new.iterdir() if not (out / p.name).exists())
        if missing:
            raise DynspecError(f"output folder {out} has no {missing[0]}, so no earlier run of this command wrote "
                               "it; --force replaces only such a folder: remove it yourself or choose another --out")


def _check_out(out: Path, force: bool, mark: Mark | None) -> bool:
    """May `out` be replaced? True when a non-empty folder is to be checked against the new output."""
    what = _kind_of(out)
    if what is not None:
        raise DynspecError(f"output folder {out} is {what}, not a folder; refusing to replace it")
    if not out.exists() or not any(out.iterdir()):
        return False
    if not force:
        raise DynspecError(f"output folder {out} exists and is not empty; pass --force to replace it")
    if mark is not None:
        _check_mark(out, mark)
    return mark is None


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike, force: bool = False, inputs: Inputs | None = None,
               mark: Mark | None = None, one_line: bool = False) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces `out`, on error it is removed.

    Before anything is written: `out` must lie apart from every input (check_apart), and a
    non-empty `out` is refused unless force=True and an earlier run of the same command wrote it
    (module doc), so nothing is overwritten by accident. With one_line=True an OSError while
    writing (a full disk, `ulimit -f`) is re-raised as OutputError, a one-line message naming the
    output and the file; otherwise it propagates as it is. Either way nothing is left behind."""
    out = Path(out)
    check_apart(out, inputs or {})
    _check_out(out, force, mark)
    tag = f"{owner_tag()}-{secrets.token_hex(4)}"
    tmp = out.parent / f".{out.name}.tmp-{tag}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(out)
        tmp.mkdir()
    except OSError as e:
        raise DynspecError(f"output folder {out} cannot be created: {e.strerror or e}") from None
    try:
        yield tmp
        _apply_umask(tmp)
        if _check_out(out, force, mark):           # checked again: `out` may have changed meanwhile
            _same_command(out, tmp)
        _swap(out, tmp, tag)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if not one_line or isinstance(e, DynspecError):
            raise
        raise OutputError(f"output folder {out} cannot be written: {e.filename or tmp}: "
                          f"{e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap(out: Path, tmp: Path, tag: str) -> None:
    """Rename tmp to out; a folder already there is renamed aside first and then removed."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{tag}"
        out.rename(old)
    try:
        tmp.rename(out)
    except OSError:
        if old is not None:
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON next to its final name, then rename (atomic on one filesystem)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write next to the final name, then rename; an unwritable path or a directory is one line."""
    path = Path(path)
    if path.is_dir():
        raise DynspecError(f"{path} is a directory; give a file name")
    tmp = path.with_name(f".{path.name}.tmp-{owner_tag()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path)
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
        raise DynspecError(f"{path} cannot be written: {e.strerror or e}") from None


def read_json(path: str | os.PathLike, what: str = "file") -> dict:
    path = Path(path)
    if not path.is_file():
        raise DynspecError(f"{what} {path} does not exist")
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DynspecError(f"{what} {path} is not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise DynspecError(f"{what} {path} is not valid JSON: {e}") from e
    except RecursionError:
        raise DynspecError(f"{what} {path} is nested too deeply to be read as JSON") from None
    if not isinstance(obj, dict):
        raise DynspecError(f"{what} {path} must hold a JSON object, not {type(obj).__name__}")
    return obj
