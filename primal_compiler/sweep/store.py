"""The results of a sweep: a directory of Parquet part files, appended as points finish.

Layout of ``RESULTS/``::

    _sweep.json                 what wrote it (format, spec file, metrics), checked on resume
    part-<seq>-<token>.parquet  finished rows, one file per flush
    _plots/                     pareto.png and sensitivity.png, written (replaced whole) by ``--plot``
    _damaged/                   parts found unreadable on a resume, moved aside (never read again)

Everything but the parts is named with a leading ``_``, which pyarrow, pandas
and Dask skip when they read a directory: ``pandas.read_parquet("RESULTS")``
reads the results as they are. A directory an earlier version wrote keeps its
``sweep.json`` (read, never renamed).

One sweep writes to a directory at a time (a resumed sweep removes the
hidden temporary part a killed one may have left).

Guarantees:

- A part file appears whole or not at all (written to a hidden temporary
  name in the same directory, fsynced, then renamed), so a sweep killed at
  any instant leaves only complete rows.
- Nothing of a user's is touched: :meth:`ResultStore.open` creates the
  directory, or uses an existing one only if it is empty or holds a valid
  ``_sweep.json`` of the same metrics; it deletes only its own hidden
  temporary parts, and :meth:`compact` only parts it has just merged.
- Damage is named, never a traceback: on :meth:`ResultStore.open` every part
  is read whole and checked (a regular file, Parquet, a non-null string
  ``point_id``, every known column of its type); a part that fails is moved
  to ``_damaged/`` and reported as one warning line, so its points run
  again. A missing, unreadable, non-JSON or foreign ``_sweep.json`` in a
  non-empty directory is an :class:`InputError` naming it (the metrics the
  parts hold cannot be checked without it). :meth:`done` and :meth:`read`
  raise an :class:`InputError` naming a damaged part instead of reading it.
- :meth:`ResultStore.done` is the set of point ids in complete parts, which a
  resumed sweep skips; :meth:`ResultStore.read` returns one row per point id
  (the first written if a crash during :meth:`compact` left a row twice).

The part files are a plain Parquet dataset (``pandas.read_parquet`` and Dask
read a list of them; ``docs/sweep.md``). Metric columns are float64; axis
columns keep their TOML type.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primal_compiler.errors import InputError
from primal_compiler.inputs import read_text

if TYPE_CHECKING:  # at run time pyarrow is imported only where it is used (_pa)
    import pyarrow as pa

FORMAT = "primal-sweep-results"
VERSION = 1
MANIFEST = "_sweep.json"
LEGACY_MANIFEST = "sweep.json"  # what earlier versions named it: still read, so their results resume
DAMAGED = "_damaged"  # pyarrow and pandas skip names starting with "_" when reading a directory
MANIFEST_LIMIT_BYTES = 16 << 20


def _pa():
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


class _Damaged(Exception):
    """A part file that cannot be used; the message says why (one line)."""


class ResultStore:
    """Append-only Parquet results of one sweep in directory ``root``."""

    def __init__(self, root: str | Path) -> None:
        if not str(root):
            raise InputError("''", "empty path where a results directory was expected")
        self.root = Path(root)
        self._types: dict[str, str] = dict(FIXED_TYPES)

    # ------------------------------------------------------------------ manifest

    def open(self, manifest: dict[str, Any], types: dict[str, str] | None = None) -> list[str]:
        """Create ``root`` (or check an existing one was written for the same metrics) and record ``manifest``.

        ``types`` are the sweep's column kinds (float/int/bool/str), checked in every existing part.
        Returns one warning line per damaged part moved to ``_damaged/`` (its points are then not done).
        """
        self._types = dict(FIXED_TYPES) | dict(types or {})
        where = str(self.root)
        try:
            if self.root.is_symlink():
                raise InputError(where, "is a symbolic link; it is never written through, name the directory itself")
            if self.root.exists() and not self.root.is_dir():
                raise InputError(where, "exists and is not a results directory")
            path = self._manifest_path()
            if path.exists() or path.is_symlink():
                old = self.manifest()
                if list(old["metrics"]) != list(manifest.get("metrics", [])):
                    raise InputError(where, f"holds results with metrics {old['metrics']}, not "
                                            f"{manifest.get('metrics')}; write to a new directory")
                for pattern in (".part-*.tmp", f".{path.name}.*.tmp"):  # what a killed sweep was writing
                    for stale in self.root.glob(pattern):
                        stale.unlink(missing_ok=True)
                return self._set_aside_damaged()
            if self.root.exists() and any(self.root.iterdir()):
                if self.parts():
                    raise InputError(str(path), "missing: the directory holds result parts but no manifest, so "
                                                "their metrics cannot be checked; restore it or choose another -o")
                raise InputError(where, "is a non-empty directory that is not a sweep's results; choose another -o")
            self.root.mkdir(parents=True, exist_ok=True)
            self._write_atomic(path, (json.dumps({"format": FORMAT, "version": VERSION, **manifest},
                                                 indent=2, sort_keys=True) + "\n").encode())
        except OSError as exc:
            raise InputError(str(exc.filename or where), f"cannot use: {exc.strerror or exc}") from None
        return []

    def _manifest_path(self) -> Path:
        """``_sweep.json``, or the ``sweep.json`` of results an earlier version wrote."""
        legacy = self.root / LEGACY_MANIFEST
        new = self.root / MANIFEST
        return legacy if not (new.exists() or new.is_symlink()) and (legacy.exists() or legacy.is_symlink()) else new

    def manifest(self) -> dict[str, Any]:
        """The checked ``_sweep.json``: a JSON object of this format and version with a list of metric names."""
        path = self._manifest_path()
        text = read_text(path, MANIFEST_LIMIT_BYTES, "sweep manifest")
        try:
            old = json.loads(text)
        except ValueError as exc:
            raise InputError(str(path), f"damaged sweep manifest (not JSON: {exc}); restore it or choose "
                                        "another -o") from None
        if not isinstance(old, dict) or old.get("format") != FORMAT:
            raise InputError(str(path), f"not a {FORMAT} manifest; choose another -o")
        if not isinstance(old.get("version"), int) or old["version"] > VERSION:
            raise InputError(str(path), f"results format version {old.get('version')!r}; this primal-compiler "
                                        f"reads version {VERSION}")
        metrics = old.get("metrics")
        if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
            raise InputError(str(path), "damaged sweep manifest: metrics is not a list of names")
        return old

    # ------------------------------------------------------------------ parts

    def parts(self) -> list[Path]:
        """Part files in write order (complete ones, unless damage was found since :meth:`open`)."""
        if not self.root.is_dir():
            return []
        return sorted(self.root.glob("part-*.parquet"))

    def done(self) -> set[str]:
        """Point ids of every complete row."""
        ids: set[str] = set()
        for p in self.parts():
            ids.update(self._read_part(p, ["point_id"]).column("point_id").to_pylist())
        return ids

    def _next(self) -> int:
        parts = self.parts()
        try:
            return int(parts[-1].name.split("-")[1]) + 1 if parts else 0
        except ValueError:  # a part named by hand: keep counting past every part
            return len(parts)

    def append(self, rows: list[dict[str, Any]], types: dict[str, str] | None = None) -> Path | None:
        """Write ``rows`` as one new part file, atomically; ``types`` maps columns to float/int/bool/str."""
        if not rows:
            return None
        return self._write_part(_table(rows, types or {}))

    def read(self) -> pa.Table | None:
        """Every row as one ``pyarrow.Table`` (one row per point id), or None if nothing is written yet."""
        pa, _ = _pa()
        tables = [self._read_part(p) for p in self.parts()]
        if not tables:
            return None
        try:
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputError(str(self.root), f"parts disagree on column types ({_first_line(exc)}); rerun the "
                                             f"sweep on this directory to move a damaged part to {DAMAGED}/") from None
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
        path = self._write_part(self.read())
        for p in parts:
            p.unlink(missing_ok=True)
        # keep names sorted in write order: the merged part is now the only one
        path.rename(self.root / f"part-000000-{path.name.rsplit('-', 1)[1]}")

    # ------------------------------------------------------------------ helpers

    def _write_part(self, table) -> Path:
        _, pq = _pa()
        path = self.root / f"part-{self._next():06d}-{secrets.token_hex(4)}.parquet"
        tmp = self.root / f".{path.name}.tmp"
        try:
            pq.write_table(table, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise InputError(str(path), f"cannot write results: {exc.strerror or exc}") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    def _read_part(self, path: Path, columns: list[str] | None = None):
        try:
            return self._load(path, columns)
        except _Damaged as exc:
            raise InputError(str(path), f"damaged results part ({exc}); rerun the sweep on this directory "
                                        f"to move it to {DAMAGED}/ and run its points again") from None

    def _load(self, path: Path, columns: list[str] | None = None):
        """The part's table (``columns`` only, if given), checked; :class:`_Damaged` saying why not."""
        pa, pq = _pa()
        if not path.is_file():  # a FIFO or device would block or never end; a directory is no part
            raise _Damaged("not a regular file")
        try:
            schema = pq.read_schema(path)
            problem = _schema_problem(schema, self._types)
            if problem:
                raise _Damaged(problem)
            table = pq.read_table(path, columns=columns)
        except (pa.ArrowException, OSError, ValueError) as exc:  # ArrowInvalid subclasses ValueError
            raise _Damaged(_first_line(exc)) from None
        if table.column("point_id").null_count:
            raise _Damaged("a null point_id")
        return table

    def _set_aside_damaged(self) -> list[str]:
        """Read every part whole; move each damaged one to ``_damaged/``. One warning line per part moved."""
        warnings = []
        for p in self.parts():
            try:
                self._load(p)
            except _Damaged as exc:
                aside = self.root / DAMAGED
                aside.mkdir(exist_ok=True)
                dest = aside / p.name
                while dest.exists() or dest.is_symlink():
                    dest = aside / f"{p.name}.{secrets.token_hex(2)}"
                os.rename(p, dest)
                warnings.append(f"{p}: damaged results part ({exc}); moved to {dest}, its points run again")
        return warnings

    @staticmethod
    def _write_atomic(path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise InputError(str(path), f"cannot write: {exc.strerror or exc}") from None


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _schema_problem(schema, types: dict[str, str]) -> str | None:
    """Why a part's schema is not one of this sweep's (``types``: known column kinds), or None.

    A known column must have its kind's type or one :meth:`ResultStore.read` promotes to it (an int column
    of a part written before a float joined its axis); ``point_id`` must be a string.
    """
    pa, _ = _pa()
    pa_types = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "str": pa.string()}
    if "point_id" not in schema.names or schema.field("point_id").type != pa.string():
        return "no point_id column" if "point_id" not in schema.names else "point_id is not a string column"
    for field in schema:
        want = pa_types.get(types.get(field.name, ""))
        if want is None or field.type == want:
            continue
        try:
            pa.unify_schemas([pa.schema([field]), pa.schema([pa.field(field.name, want)])],
                             promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return f"column {field.name} is {field.type}, not {want}"
    return None


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

