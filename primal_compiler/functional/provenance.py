"""Which record produced every value a replayed record consumes, at element granularity.

A :class:`Provenance` is kept by a :class:`~primal_compiler.functional.machine.Machine` built with
``producers=True``. It holds, beside every buffer, an int64 array of the same ``V x E`` shape naming the
record that last wrote each element (-1: unwritten, where the buffer holds NaN); beside every KV chunk the
record that last appended each token row; and the last writer of every piece of persistent state, keyed by
a tuple:

* ``("sram", ct, pe, slot)``: SRAM slot contents, written by CONFIG;
* ``("mask", ct, pe)``: the whole mask register, written by MASK; ``("mask", ct, pe, slot)``: its bit
  ``slot``, cleared by CONFIG of that slot;
* ``("ctl", seq)``: the controller's last token and position counter of sequence ``seq``, written by ARGMAX.

Records run in index order, so the writer of a value held under several keys (mask bit ``s`` of a PE) is
the latest of their writers. Each read logs ``(consumer, producer)`` for the producers of exactly the
elements it consumed; unwritten elements name no producer. :meth:`pairs` returns them deduplicated.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.arrays import distinct

Key = tuple[int, int, int]


class Provenance:
    """Producers of the replay's state and the (consumer, producer) pairs logged so far."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.buffers: dict[Key, np.ndarray] = {}
        self.kv: dict[Key, np.ndarray] = {}
        self.state: dict[tuple[int | str, ...], int] = {}
        self._keys: list[np.ndarray] = []

    def wrote(self, key: Key, shape: tuple[int, int], kept: bool, offset: int, width: int, record: int) -> None:
        """``record`` wrote elements ``offset:width`` of every vector of buffer ``key``, which is now ``shape``:
        the old buffer widened if ``kept``, else a new one (as Machine.write decided); other elements keep
        their producers, or -1 where the buffer was widened or replaced (NaN there)."""
        own = np.full(shape, -1, np.int64)
        old = self.buffers.get(key) if kept else None
        if old is not None:
            own[:, : old.shape[1]] = old
        own[:, offset:width] = record
        self.buffers[key] = own

    def consumed(self, record: int, producers: np.ndarray | int) -> None:
        """``record`` consumed values produced by ``producers`` (-1 entries: unwritten, ignored)."""
        p = distinct(np.asarray(producers, dtype=np.int64))
        p = p[p >= 0]
        if len(p):
            self._keys.append(record * self.records + p)

    def latest(self, *keys: tuple[int | str, ...]) -> int:
        """The last record that wrote any of the state ``keys``, -1 if none did."""
        return max(self.state.get(k, -1) for k in keys)

    def kv_rows(self, key: Key, tokens: int) -> np.ndarray:
        """Producers of the token rows of KV chunk ``key`` (created unwritten)."""
        rows = self.kv.get(key)
        if rows is None:
            rows = self.kv[key] = np.full(tokens, -1, np.int64)
        return rows

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(consumer, producer) int64 arrays of every distinct pair, sorted by consumer then producer."""
        if not self._keys:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        keys = distinct(np.concatenate(self._keys))
        return keys // self.records, keys % self.records
