"""The results of a sweep: a directory of Parquet part files, appended as points finish.

Layout of ``RESULTS/``::

    sweep.json                  what wrote it (format, spec file, metrics), checked on resume
    part-<seq>-<token>.parquet  finished rows, one file per flush
    pareto.png sensitivity.png  written by ``--plot``

One sweep writes to a directory at a time (a resumed sweep removes the
hidden temporary part a killed one may have left).

Guarantees: a part file appears whole or not at all (written to a hidden
temporary name in the same directory, fsynced, then renamed), so a sweep
killed at any instant leaves only complete rows; :meth:`ResultStore.done`
is the set of point ids in complete parts, which a resumed sweep skips;
:meth:`ResultStore.read` returns one row per point id (the first written if a
crash during :meth:`compact` left a row twice). The directory is a plain
Parquet dataset: ``pyarrow.dataset.dataset(RESULTS)``, ``pandas.read_parquet``
and Dask read it directly (hidden and non-``.parquet`` files are ignored by
them). Metric columns are float64; axis columns keep their TOML type.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from primal_compiler.errors import InputError

FORMAT = "primal-sweep-results"
VERSION = 1
MANIFEST = "sweep.json"


def _pa():
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


class ResultStore:
    """Append-only Parquet results of one sweep in directory ``root``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # ------------------------------------------------------------------ manifest

    def open(self, manifest: dict[str, Any]) -> None:
        """Create ``root`` (or check an existing one was written for the same metrics) and record ``manifest``."""
        where = str(self.root)
        if self.root.exists() and not self.root.is_dir():
            raise InputError(where, "exists and is not a results directory")
        path = self.root / MANIFEST
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise InputError(str(path), f"unreadable sweep manifest: {exc}") from None
            if old.get("format") != FORMAT:
                raise InputError(str(path), f"not a {FORMAT} manifest")
            if list(old.get("metrics", [])) != list(manifest.get("metrics", [])):
                raise InputError(where, f"holds results with metrics {old.get('metrics')}, not "
                                        f"{manifest.get('metrics')}; write to a new directory")
            for stale in self.root.glob(".part-*.tmp"):  # a part a killed sweep was writing
                stale.unlink(missing_ok=True)
            return
        if self.root.exists() and any(self.root.iterdir()):
            raise InputError(where, "is a non-empty directory that is not a sweep's results; choose another -o")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(where, f"cannot create: {exc.strerror or exc}") from None
        self._write_atomic(path, (json.dumps({"format": FORMAT, "version": VERSION, **manifest},
                                             indent=2, sort_keys=True) + "\n").encode())

    def manifest(self) -> dict[str, Any]:
        try:
            return json.loads((self.root / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise InputError(str(self.root), f"not a sweep results directory ({exc})") from None

    # ------------------------------------------------------------------ parts

    def parts(self) -> list[Path]:
        """Complete part files, in write order."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("part-*.parquet") if not p.name.startswith("."))

    def done(self) -> set[str]:
        """Point ids of every complete row."""
        _, pq = _pa()
        ids: set[str] = set()
        for p in self.parts():
            ids.update(pq.read_table(p, columns=["point_id"]).column("point_id").to_pylist())
        return ids

    def _next(self) -> int:
        parts = self.parts()
        return int(parts[-1].name.split("-")[1]) + 1 if parts else 0

    def append(self, rows: list[dict[str, Any]], types: dict[str, str] | None = None) -> Path | None:
        """Write ``rows`` as one new part file, atomically; ``types`` maps columns to float/int/bool/str."""
        if not rows:
            return None
        pa, pq = _pa()
        table = _table(rows, types or {})
        seq = self._next()
        path = self.root / f"part-{seq:06d}-{secrets.token_hex(4)}.parquet"
        tmp = self.root / f".{path.name}.tmp"
        try:
            pq.write_table(table, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    def read(self):
        """Every row as one ``pyarrow.Table`` (one row per point id), or None if nothing is written yet."""
        pa, pq = _pa()
        tables = [pq.read_table(p) for p in self.parts()]
        if not tables:
            return None
        table = pa.concat_tables(tables, promote_options="permissive")
        ids = table.column("point_id").to_pylist()
        first: dict[str, int] = {}
        for i, pid in enumerate(ids):
            first.setdefault(pid, i)
        if len(first) != len(ids):
            table = table.take(sorted(first.values()))
        return table

    def compact(self) -> None:
        """Merge every part into one (new part written before the old ones are removed)."""
        parts = self.parts()
        if len(parts) <= 1:
            return
        _, pq = _pa()
        table = self.read()
        path = self.root / f"part-{self._next():06d}-{secrets.token_hex(4)}.parquet"
        tmp = self.root / f".{path.name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        for p in parts:
            p.unlink(missing_ok=True)
        # keep names sorted in write order: the merged part is now the only one
        path.rename(self.root / f"part-000000-{path.name.rsplit('-', 1)[1]}")

    @staticmethod
    def _write_atomic(path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


FIXED_TYPES = {"point_id": "str", "grid": "str", "compiled_pipeline": "str", "program_hash": "str", "error": "str",
               "worker": "str", "finished_at": "str", "run_id": "str", "wall_s": "float", "compile_s": "float",
               "replay_s": "float"}


def column_kind(values: list[Any]) -> str:
    """``bool``, ``int``, ``float`` or ``str``: the one Parquet type that holds every value."""
    kinds = {type(v) for v in values if v is not None}
    if kinds == {bool}:
        return "bool"
    if kinds and kinds <= {int}:
        return "int"
    if kinds and kinds <= {int, float}:
        return "float"
    return "str"


def _table(rows: list[dict[str, Any]], types: dict[str, str]):
    pa, _ = _pa()
    pa_types = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "str": pa.string()}
    names = list(dict.fromkeys(k for r in rows for k in r))
    arrays, fields = [], []
    for name in names:
        values = [r.get(name) for r in rows]
        kind = FIXED_TYPES.get(name) or types.get(name) or column_kind(values)
        if kind == "str":
            values = [None if v is None else str(v) for v in values]
        elif kind == "float":
            values = [None if v is None else float(v) for v in values]
        typ = pa_types[kind]
        arrays.append(pa.array(values, type=typ))
        fields.append(pa.field(name, typ))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

