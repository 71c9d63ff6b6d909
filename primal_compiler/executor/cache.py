"""A replay's schedule kept on disk under the hash of what it follows from, so a second replay reads it.

What is kept is what the expensive stages compute (``deps``, ``schedule``, ``memory``): every record's
dispatch, start and finish cycles, the links its bits crossed, and the scratchpad occupancy. The cheap
stages (``transfers``, ``costs``, ``control``, ``power``) run again on a hit, so everything a report,
picture or thermal map draws from is computed by the same code as after a full replay; the report's
figures are byte-identical (``tests/executor/test_cache.py``).

Guarantees:

- An entry is used only when its key matches: the sha256 of the program (meta, arrays, stream), every
  target value the timing depends on (``replay.timing_hash``: energy-only keys left out, so a replay under
  changed energy constants reads the schedule and prices it anew), the control mode, and the source of this package (so a changed simulator never
  reads an old schedule). A throttled replay (``max_active_pes``) is never cached.
- An entry is used only when the sha256 of its bytes, written beside them, matches; anything else (a
  truncated, edited or foreign file) is reported in one line and replayed over, never read.
- A cache directory that cannot be created, read or written is reported in one line; the replay runs
  without it. Entries are written to a temporary sibling and renamed into place, so a reader sees a whole
  entry or none; only files named like entries are ever removed (the oldest first, past ``limit_bytes``),
  and temporaries of entries whose writing process no longer runs (one killed mid-write).
- A replay served from the cache has no dependency edges and no per-link waits (``Replay.from_cache``):
  the critical path (:mod:`.critical`) needs a full replay and callers asking for it pass no cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sys
import zipfile
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from primal_compiler.executor.memory import Memory
from primal_compiler.outdir import pid_alive
from primal_compiler.isa.stream import Stream
from primal_compiler.version import __version__

FORMAT = "primal-replay-cache/1"
_ENTRY = re.compile(r"^[0-9a-f]{64}\.npz$")
_TMP = re.compile(r"^\.[0-9a-f]{64}\.npz\.primal-tmp\.(?P<pid>\d+)\.[0-9a-f]{12}$")
_PER_RECORD = ("dispatch", "start", "finish", "n_mesh", "n_other")
_MEMORY = ("kv_bytes", "peak_bytes", "peak_cycle", "inst_loc", "inst_bytes", "inst_first", "inst_begin", "inst_end")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def default_directory() -> Path:
    """``$XDG_CACHE_HOME/primal-compiler/replays`` (the XDG base-directory convention; ``~/.cache`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "primal-compiler" / "replays"


@dataclass(frozen=True)
class ReplayCache:
    """Where replays are kept (``directory``), how much it may hold (``limit_bytes``; assumed 4 GiB: about 40
    Llama-2-13B replays of 100 MB), and where its one-line notices go (``say``, standard error by default)."""

    directory: Path = field(default_factory=default_directory)
    limit_bytes: int = 4 * 2**30
    say: Callable[[str], None] = _stderr


@dataclass(frozen=True, eq=False)
class Schedule:
    """What an entry holds: the per-record schedule and the scratchpad occupancy of one replay."""

    dispatch: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    n_mesh: np.ndarray
    n_other: np.ndarray
    memory: Memory | None


@cache
def _code() -> str:
    """sha256 of this package's source (``.py`` and ``.toml`` files, by relative path)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".toml") and p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _update(digest, arrays: Iterable[tuple[str, np.ndarray]]) -> None:
    for name, a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        digest.update(a.reshape(-1).view(np.uint8))


def replay_key(meta: dict, arrays: dict, stream: Stream, target_hash: str, mode: str) -> str:
    """The key of a replay: sha256 of the program (meta, arrays, stream), target, control mode and code."""
    digest = hashlib.sha256()
    digest.update(json.dumps([FORMAT, _code(), target_hash, mode, meta], sort_keys=True, default=str).encode())
    _update(digest, sorted(arrays.items()))
    _update(digest, [("records", stream.records), ("group_ptr", stream.group_ptr),
                     ("group_ct", stream.group_ct), ("group_pe", stream.group_pe)])
    digest.update(json.dumps([[s.name, s.start, s.stop] for s in stream.sections]).encode())
    return digest.hexdigest()


def _columns(s: Schedule) -> dict[str, np.ndarray]:
    out = {name: getattr(s, name) for name in _PER_RECORD}
    if s.memory is not None:
        out |= {f"memory.{name}": getattr(s.memory, name) for name in _MEMORY}
    return out


def _narrow(a: np.ndarray) -> np.ndarray:
    """``a`` in the smallest signed integer type holding its values (losslessly; widened back on reading):
    Llama-2-13B's cycles fit 32 bits and its link counts 8, so an entry is about half the size."""
    if a.dtype.kind not in "iu" or not len(a):
        return a
    lo, hi = int(a.min()), int(a.max())
    kind = next(t for t in (np.int8, np.int16, np.int32, np.int64)
                if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max or t is np.int64)
    return a.astype(kind) if np.dtype(kind).itemsize < a.dtype.itemsize else a


def _header(key: str, s: Schedule, columns: dict[str, np.ndarray]) -> dict:
    m = s.memory
    memory = None if m is None else {"capacity_bytes": m.capacity_bytes, "phase_peak": m.phase_peak,
                                      "overflow": None if m.overflow is None else list(m.overflow), "pes": m.pes}
    return {"format": FORMAT, "key": key, "memory": memory,
            "dtypes": {name: a.dtype.str for name, a in sorted(columns.items())}}


def _checksum(header: dict, columns: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    _update(digest, sorted(columns.items()))
    return digest.hexdigest()


def lookup(c: ReplayCache, key: str) -> Schedule | None:
    """The schedule kept under ``key``, or None (absent; unreadable or corrupted: said in one line)."""
    path = c.directory / f"{key}.npz"
    try:
        if not path.is_file():
            return None
        with np.load(path, allow_pickle=False) as z:
            stored = {name: z[name] for name in z.files}
        header = json.loads(bytes(stored.pop("header")).decode())
        checksum = bytes(stored.pop("checksum")).decode()
        signed = (isinstance(header, dict) and header.get("format") == FORMAT and header.get("key") == key
                  and _checksum(header, stored) == checksum)
        if not signed:
            c.say(f"{path}: replay cache entry corrupted (its sha256 does not match); replaying")
            return None
        stored = {name: stored[name].astype(dtype) for name, dtype in header["dtypes"].items()}
        mem = header["memory"]
        memory = None if mem is None else Memory(
            capacity_bytes=int(mem["capacity_bytes"]), phase_peak=dict(mem["phase_peak"]), pes=int(mem["pes"]),
            overflow=None if mem["overflow"] is None else tuple(mem["overflow"]),
            **{n: stored[f"memory.{n}"] for n in _MEMORY})
        kept = Schedule(stored["dispatch"], stored["start"], stored["finish"], stored["n_mesh"], stored["n_other"],
                        memory)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        c.say(f"{path}: replay cache entry unreadable ({type(exc).__name__}); replaying")
        return None
    with suppress(OSError):  # its use, for the oldest-first eviction; an entry gone or read-only meanwhile is fine
        os.utime(path)
    return kept


def store(c: ReplayCache, key: str, s: Schedule) -> None:
    """Keep ``s`` under ``key`` (atomically), then remove the least recently used entries past the limit; a
    directory that cannot be written is said in one line and nothing else happens."""
    columns = _columns(s)
    header = _header(key, s, columns)
    narrow = {name: _narrow(a) for name, a in columns.items()}
    stored: dict[str, Any] = narrow | {"header": np.frombuffer(json.dumps(header).encode(), np.uint8),
                                       "checksum": np.frombuffer(_checksum(header, narrow).encode(), np.uint8)}
    path = c.directory / f"{key}.npz"
    tmp = c.directory / f".{key}.npz.primal-tmp.{os.getpid()}.{secrets.token_hex(6)}"
    try:
        c.directory.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            c.say(f"{path}: not a regular file, left alone; the replay ran without the cache")
            return
        with open(tmp, "xb") as f:
            np.savez(f, **stored)
        os.replace(tmp, path)
    except OSError as exc:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        c.say(f"{c.directory}: replay cache not written ({exc.strerror or exc}); the replay ran without it")
        return
    except BaseException:  # an interrupt mid-write leaves no temporary behind
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    _evict(c, path.name)


def _evict(c: ReplayCache, kept: str) -> None:
    """Remove the least recently used entries (never ``kept``, the one just written) while the entries hold
    more than ``c.limit_bytes``, and temporaries of entries whose writing process no longer runs (killed
    mid-write)."""
    try:
        for p in c.directory.iterdir():
            m = _TMP.match(p.name)
            if m and not pid_alive(int(m["pid"])) and p.is_file() and not p.is_symlink():
                p.unlink()
        entries = [(p.stat().st_mtime_ns, p.name, p) for p in c.directory.iterdir()
                   if _ENTRY.match(p.name) and p.is_file() and not p.is_symlink()]
        total = sum(p.stat().st_size for _, _, p in entries)
        for _, name, path in sorted(entries):
            if total <= c.limit_bytes:
                break
            if name == kept:
                continue
            total -= path.stat().st_size
            path.unlink()
    except OSError as exc:
        c.say(f"{c.directory}: replay cache not trimmed ({exc.strerror or exc})")
