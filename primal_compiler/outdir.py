"""Every verb's output: written beside its destination, swapped in whole, never over a user's files.

Guarantees (``docs/outputs.md``):

- A destination directory is created fresh, or replaced only when it is one this
  tool wrote (its :data:`MARKER` lists every entry, and it holds nothing else,
  nested outputs of ours excepted) *and* the caller passes ``force``. Anything
  else, and always ``.``, ``..``, ``/``, the home directory and any ancestor of
  the current directory, is refused with an :class:`InputError` naming the path;
  nothing is deleted.
- A destination file is created fresh, or, only with ``force``, replaces a regular file.
- Never replaced, ``force`` or not: anything that is neither a regular file nor a
  directory (a device, a FIFO, a socket), a symbolic link (to anything), and the
  verb's inputs: a path that is one of them (the same file under another name
  included), holds one, or (for a file) lies inside an input directory.
- The destination is checked again just before the swap, so one that became
  any of these while the verb worked is still refused.
- Content goes to a temporary sibling ``.NAME.primal-tmp.PID.HEX`` first. An
  existing directory is swapped with it in one ``renameat2(RENAME_EXCHANGE)``
  where the kernel has it (otherwise renamed aside, then in), so some complete
  version exists under the name at every moment; the old one is removed after.
- On any exception, ``KeyboardInterrupt`` and SIGTERM (see :mod:`primal_compiler.cli`)
  included, the temporary sibling is removed. Siblings left by a killed process
  (its PID no longer running) are removed by the next write to the same place;
  a directory left renamed aside with nothing under the name is renamed back.
- Every ``OSError`` becomes a one-line ``InputError`` naming the path.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from primal_compiler.errors import InputError, one_line
from primal_compiler.signals import raise_if_received

#: The file that marks a directory as written by this tool; JSON ``{"tool", "verb", "entries"}``.
MARKER = ".primal-output"
TOOL = "primal-compiler"
_TMP = re.compile(r"^\.(?P<name>.+)\.primal-(?P<kind>tmp|old)\.(?P<pid>\d+)\.[0-9a-f]{12}$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _fail(path: Path | str, exc: OSError, doing: str = "cannot write") -> InputError:
    reason = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    return InputError(str(path), f"{doing}: {reason}")


def _real(path: Path) -> Path:
    """``path`` with every symbolic link resolved; a loop among the links of its parents is an InputError."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:  # Python 3.11 raises RuntimeError on a loop, 3.13 OSError
        raise InputError(str(path), f"cannot resolve its symbolic links ({one_line(exc, 120)})") from None


def _protected(dest: Path) -> str | None:
    """Why ``dest`` may never be replaced, or None."""
    real = _real(dest)
    cwd = Path.cwd().resolve()
    if real == Path(real.anchor):
        return "is the root directory"
    if real == Path.home().resolve():
        return "is the home directory"
    if real == cwd or real in cwd.parents:
        return "is the current directory or one of its ancestors"
    return None


def _marker_entries(path: Path) -> set[str] | None:
    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
        return set(marker["entries"]) if marker.get("tool") == TOOL else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _ours(path: Path) -> str | None:
    """None if ``path`` is a directory of ours holding nothing but what its marker lists, else why not.

    A subdirectory the marker does not list is still ours if it is itself such a directory (``primal viz``
    writes OUT/viz into a compile output).
    """
    listed = _marker_entries(path)
    if listed is None:
        return "was not written by primal (no valid .primal-output marker)"
    for dirpath, dirnames, filenames in os.walk(path):
        rel = Path(dirpath).relative_to(path)
        for name in sorted(dirnames):
            entry = (rel / name).as_posix()
            if entry not in listed:
                if (Path(dirpath) / name).is_symlink() or _ours(Path(dirpath) / name) is not None:
                    return f"holds {entry}/, which primal did not write"
                dirnames.remove(name)
        for name in sorted(filenames):
            entry = (rel / name).as_posix()
            if entry not in listed and entry != MARKER:
                return f"holds {entry}, which primal did not write"
    return None


def _walk(root: Path) -> list[str]:
    """Every entry below ``root`` as a relative POSIX path, symlinks not followed."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        out += [(rel / n).as_posix() for n in (*dirnames, *filenames)]
    return sorted(e for e in out if e != MARKER)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts): whose temporary files are still in use."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _sweep_stale(dest: Path) -> None:
    """Remove temporaries a killed run left beside ``dest``; restore a version left renamed aside."""
    try:
        siblings = os.listdir(dest.parent)
    except OSError:
        return
    for name in sorted(siblings):
        m = _TMP.match(name)
        if not m or m["name"] != dest.name or pid_alive(int(m["pid"])):
            continue
        stale = dest.parent / name
        if m["kind"] == "old" and not os.path.lexists(dest):
            os.replace(stale, dest)
        elif stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def _sibling(dest: Path, kind: str) -> Path:
    return dest.parent / f".{dest.name}.primal-{kind}.{os.getpid()}.{secrets.token_hex(6)}"


def _check_parent(dest: Path, need_bytes: int) -> None:
    """The nearest existing ancestor of ``dest`` must be a writable directory with ``need_bytes`` free."""
    up = next(p for p in (dest.parent, *dest.parent.parents) if os.path.lexists(p))
    if not up.is_dir():
        raise InputError(str(dest), f"{up} is not a directory")
    if not os.access(up, os.W_OK | os.X_OK):
        raise InputError(str(dest), f"cannot write in {up}: permission denied")
    free = shutil.disk_usage(up).free if need_bytes else 0
    if need_bytes and free < need_bytes:
        raise InputError(str(dest), f"needs about {need_bytes:,} bytes but {up} has {free:,} free")


def _special(path: Path) -> str | None:
    """What ``path`` is if it exists and is neither a regular file nor a directory (``lstat``: links not followed)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _fail(path, exc, "cannot inspect") from None
    for test, kind in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def _same(a: Path, b: Path) -> bool:
    """Whether two existing paths are one file (a hard link, a bind mount); False if either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_inputs(path: Path, where: str, directory: bool, inputs: Sequence[str | os.PathLike]) -> None:
    """Refuse ``path`` if it is, holds or (a file) lies inside one of the verb's ``inputs``."""
    real = _real(path)
    for given in inputs:
        read = _real(Path(given))
        if real == read or real in read.parents or _same(path, read):
            raise InputError(where, f"is or holds this command's input {given}; write the output elsewhere")
        if not directory and read in real.parents and read.is_dir():
            raise InputError(where, f"lies inside this command's input {given}; write the output elsewhere")


def existing(*given: str | os.PathLike | None) -> tuple[str, ...]:
    """Those ``given`` argument values that name an existing path: the files a verb reads (a model, a target
    or pipeline TOML, a trace, an adapter directory), which its outputs may not replace. A built-in name
    (``tiny-llama``, ``primal-7nm``) names no path and is left out."""
    return tuple(str(v) for v in given if v is not None and str(v) and os.path.lexists(v))  # lexists: never raises


def check_destination(dest: str | os.PathLike, force: bool, directory: bool, need_bytes: int = 0,
                      inputs: Sequence[str | os.PathLike] = ()) -> Path:
    """``dest`` as a Path if an output may be written there; ``InputError`` naming it (and why) if not.

    ``inputs`` are the files and directories the verb reads: ``dest`` may be none of them nor hold one.
    Temporaries that a killed run left beside ``dest`` are tidied first (see the module's guarantees).
    """
    if not str(dest):
        raise InputError("''", "empty output path")
    path = Path(dest)
    if path.name in ("", ".", ".."):
        raise InputError(str(dest), "names a directory that is never replaced; name a new one")
    if path.is_symlink():
        raise InputError(str(dest), "is a symbolic link; it is never replaced, name a new path")
    why = _protected(path)
    if why:
        raise InputError(str(dest), f"{why}; it is never replaced, name a new directory")
    kind = _special(path)
    if kind:
        raise InputError(str(dest), f"is {kind}, not a regular file or directory; it is never replaced")
    _check_inputs(path, str(dest), directory, inputs)
    _check_parent(path, need_bytes)
    try:
        _sweep_stale(path)
    except OSError as exc:
        raise _fail(path, exc, "cannot tidy the temporaries beside it") from None
    if not path.exists():
        return path
    if directory:
        if not path.is_dir():
            raise InputError(str(dest), "exists and is not a directory")
        if not any(True for _ in path.iterdir()):
            return path
        why = _ours(path)
        if why:
            raise InputError(str(dest), f"exists and {why}; it is never replaced, name a new directory")
        if not force:
            raise InputError(str(dest), "exists (an earlier primal output); pass --force to replace it")
    else:
        if path.is_dir():
            raise InputError(str(dest), "is a directory, not a file")
        if not force:
            raise InputError(str(dest), "exists; pass --force to replace it")
    return path


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _install_directory(tmp: Path, dest: Path) -> None:
    if not os.path.lexists(dest):
        os.rename(tmp, dest)
        return
    if _exchange(tmp, dest):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old version
        return
    old = _sibling(dest, "old")
    os.rename(dest, old)
    os.rename(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def output_directory(dest: str | os.PathLike, verb: str, force: bool = False, need_bytes: int = 0,
                     inputs: Sequence[str | os.PathLike] = ()) -> Iterator[Path]:
    """A fresh directory to fill; it becomes ``dest`` (marked as ours) only if the block succeeds.

    ``dest`` is checked by :func:`check_destination` before the block runs. The result has the umask's
    permissions, not mkdtemp's 0700.
    """
    path = check_destination(dest, force, directory=True, need_bytes=need_bytes, inputs=inputs)
    tmp = _sibling(path, "tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(tmp)
    except OSError as exc:
        raise _fail(path, exc) from None
    try:
        yield tmp
        marker = {"tool": TOOL, "verb": verb, "entries": _walk(tmp)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        check_destination(path, force, directory=True, inputs=inputs)  # it may have changed while we worked
        raise_if_received()  # an interrupt something swallowed commits nothing
        _install_directory(tmp, path)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _fail(path, exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def output_file(dest: str | os.PathLike, force: bool = False, need_bytes: int = 0,
                inputs: Sequence[str | os.PathLike] = ()) -> Iterator[BinaryIO]:
    """A binary file to write; it replaces ``dest`` only if the block succeeds (and ``dest`` is new or ``force``).

    Inside a directory this process is filling (``output_directory``), pass ``force=True``: nothing of the
    user's is there.
    """
    path = check_destination(dest, force, directory=False, need_bytes=need_bytes, inputs=inputs)
    tmp = _sibling(path, "tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise _fail(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        check_destination(path, force, directory=False, inputs=inputs)  # it may have changed while we worked
        raise_if_received()  # an interrupt something swallowed commits nothing
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _fail(path, exc) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
