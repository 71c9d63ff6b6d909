"""An IPCN instruction stream: records, the multicast/reduce group table and sections.

Groups are stored as CSR columns: members of group ``g`` are
``group_ct[group_ptr[g]:group_ptr[g+1]]`` / ``group_pe[...]``. Sections name
contiguous record ranges (``prefill``, ``decode``, ``adapter:N``...), in
stream order, covering the stream without overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.isa.opcodes import RECORD, empty


@dataclass(frozen=True)
class Section:
    name: str
    start: int
    stop: int


@dataclass(frozen=True, eq=False)
class Stream:
    records: np.ndarray
    group_ptr: np.ndarray  # int64 (G+1,)
    group_ct: np.ndarray  # uint16
    group_pe: np.ndarray  # uint16
    sections: tuple[Section, ...] = ()

    def __len__(self) -> int:
        return len(self.records)

    @property
    def num_groups(self) -> int:
        return len(self.group_ptr) - 1

    @property
    def nbytes(self) -> int:
        return self.records.nbytes + self.group_ptr.nbytes + self.group_ct.nbytes + self.group_pe.nbytes

    def section(self, name: str) -> np.ndarray:
        """Records of the section called ``name``; KeyError naming the sections present."""
        for s in self.sections:
            if s.name == name:
                return self.records[s.start : s.stop]
        raise KeyError(f"no section {name!r}; the stream has {[s.name for s in self.sections]}")

    def group_sizes(self) -> np.ndarray:
        return np.diff(self.group_ptr)


class StreamBuilder:
    """Collects record blocks and groups, then freezes them into a :class:`Stream`."""

    def __init__(self) -> None:
        self._blocks: list[np.ndarray] = []
        self._length = 0
        self._sizes: list[np.ndarray] = []
        self._cts: list[np.ndarray] = []
        self._pes: list[np.ndarray] = []
        self._num_groups = 0
        self._sections: list[Section] = []
        self._open: tuple[str, int] | None = None

    def __len__(self) -> int:
        return self._length

    def records(self, n: int, **fields: object) -> np.ndarray:
        """Append ``n`` records with the given field values (scalars or length-``n`` arrays)."""
        rec = empty(n)
        for name, value in fields.items():
            rec[name] = value
        self._blocks.append(rec)
        self._length += n
        return rec

    def groups(self, sizes: np.ndarray, ct: np.ndarray, pe: np.ndarray) -> np.ndarray:
        """Add ``len(sizes)`` groups whose members are consecutive runs of ``ct``/``pe``; their ids."""
        sizes = np.asarray(sizes, dtype=np.int64)
        if sizes.sum() != len(ct) or len(ct) != len(pe):
            raise ValueError("group member columns do not match the group sizes")
        ids = np.arange(self._num_groups, self._num_groups + len(sizes), dtype=np.int64)
        self._sizes.append(sizes)
        self._cts.append(np.asarray(ct, dtype=np.uint16))
        self._pes.append(np.asarray(pe, dtype=np.uint16))
        self._num_groups += len(sizes)
        return ids

    def begin(self, name: str) -> None:
        if self._open is not None:
            self.end()
        self._open = (name, self._length)

    def end(self) -> None:
        if self._open is not None:
            name, start = self._open
            self._sections.append(Section(name, start, self._length))
            self._open = None

    def build(self) -> Stream:
        self.end()
        records = np.concatenate(self._blocks) if self._blocks else np.zeros(0, RECORD)
        sizes = np.concatenate(self._sizes) if self._sizes else np.zeros(0, np.int64)
        ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        ct = np.concatenate(self._cts) if self._cts else np.zeros(0, np.uint16)
        pe = np.concatenate(self._pes) if self._pes else np.zeros(0, np.uint16)
        return Stream(records, ptr, ct, pe, tuple(self._sections))
