"""Reading a user's input file: a regular file within a size limit, text in UTF-8, or a one-line error.

Every verb reads its files (models, targets, pipelines, sweep specs, program
text and program files, adapter configs) through :func:`regular_file`,
:func:`read_bytes` or :func:`read_text`, so a FIFO, a device such as
``/dev/zero``, a directory, an unreadable or oversized file is refused before
any parser sees it, with an :class:`~primal_compiler.errors.InputError` naming
the file. Nothing here blocks: a FIFO is recognised by ``stat`` and never opened.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from primal_compiler.errors import InputError

MIB = 1 << 20
#: Limits by kind of input. Targets, pipelines, sweep specs and adapter configs are small hand-written
#: files: 64 MiB is far above any real one. Program text and program files are generated: 8 GiB is above
#: ``primal disasm`` of the largest built-in model and still refuses ``/dev/zero``-sized mistakes.
TEXT_LIMIT_BYTES = 64 * MIB
PROGRAM_LIMIT_BYTES = 8192 * MIB
#: protobuf refuses messages over 2 GiB, so an ONNX file with weights inside cannot be larger.
ONNX_LIMIT_BYTES = 2048 * MIB


def _a(what: str) -> str:
    """``what`` with its indefinite article ("an ONNX model", "a target file")."""
    return ("an " if what[:1].lower() in "aeiou" else "a ") + what


def regular_file(path: str | os.PathLike, limit_bytes: int, what: str = "file") -> Path:
    """``path`` as a Path if it names a readable regular file of at most ``limit_bytes`` (symlinks followed).

    Raises ``InputError(path, ...)`` naming the problem: missing, a directory, a FIFO/device/socket,
    unreadable, or too large.
    """
    p = Path(path)
    where = str(path) or "''"
    if not str(path):
        raise InputError(where, f"empty path where {_a(what)} was expected")
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(where, f"no such {what}") from None
    except OSError as exc:
        raise InputError(where, f"cannot read: {exc.strerror or exc}") from None
    except ValueError:  # a NUL byte in the path
        raise InputError(repr(str(path)), f"is not a valid path for {_a(what)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(where, f"is a directory, not {_a(what)}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
        raise InputError(where, f"is {kind}, not a regular {what}")
    if st.st_size > limit_bytes:
        raise InputError(where, f"is {st.st_size:,} bytes; {_a(what)} may be at most {limit_bytes:,} bytes")
    if not os.access(p, os.R_OK):
        raise InputError(where, "cannot read: permission denied")
    return p


def read_bytes(path: str | os.PathLike, limit_bytes: int, what: str = "file") -> bytes:
    """The contents of a regular file checked by :func:`regular_file`; read errors become ``InputError``."""
    p = regular_file(path, limit_bytes, what)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            # One byte past the size the file has now, not past the limit: read(n) reserves n bytes first.
            data = f.read(min(size, limit_bytes) + 1)
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None
    if len(data) > size:
        raise InputError(str(path), f"grew while it was read; {_a(what)} must not change while primal reads it")
    return data


def read_text(path: str | os.PathLike, limit_bytes: int = TEXT_LIMIT_BYTES, what: str = "file") -> str:
    """UTF-8 text of a regular file (a leading byte-order mark is dropped); undecodable bytes are an ``InputError``."""
    data = read_bytes(path, limit_bytes, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(str(path), f"is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None


def read_toml(path: str | os.PathLike, what: str = "file") -> dict[str, Any]:
    """The tables of a TOML file read by :func:`read_text`; a syntax error or absurd nesting is an ``InputError``."""
    text = read_text(path, TEXT_LIMIT_BYTES, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(str(path), f"invalid TOML: {exc}") from None
    except RecursionError:
        raise InputError(str(path), "invalid TOML: arrays or tables nested too deeply") from None
