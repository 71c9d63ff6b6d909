"""Program: everything the compiler knows about one model on one target.

A Program is immutable; passes return evolved copies. ``facts`` are the
guarantees established so far (:class:`~primal_compiler.ir.facts.Fact`);
``records`` is the replayable history of passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from primal_compiler.errors import InputError
from primal_compiler.ir.facts import Fact
from primal_compiler.ir.model import Model
from primal_compiler.ir.tiles import TileTable

T = TypeVar("T")

if TYPE_CHECKING:  # the stages' own types; ir/ imports no stage at run time
    from primal_compiler.codegen.kvmap import KvMap
    from primal_compiler.isa.stream import Stream
    from primal_compiler.mapping.layout import Layout


@dataclass(frozen=True, eq=False)
class Program:
    model: Model
    facts: frozenset[Fact] = frozenset()
    records: tuple = ()
    tiles: TileTable | None = None
    layout: Layout | None = None  # once blocked
    kv: KvMap | None = None  # once kv-ring ran
    stream: Stream | None = None  # once codegen ran
    power: dict[str, Any] | None = None  # SRPG schedule arrays (pg_ct, pg_on, pg_off) once srpg ran
    pending_details: dict[str, Any] = field(default_factory=dict)
    target: Any = None  # the PrimalTarget ``api.compile_model`` compiled it for (never written to a file)

    def evolve(self, **changes: Any) -> Program:
        return replace(self, **changes)

    def need_tiles(self) -> TileTable:
        """The tile table; InputError naming what has not run when there is none."""
        return _need(self.tiles, "tiles (lower-tiles has not run)")

    def need_layout(self) -> Layout:
        return _need(self.layout, "layout (blocking has not run)")

    def need_kv(self) -> KvMap:
        return _need(self.kv, "KV map (kv-ring has not run)")

    def need_stream(self) -> Stream:
        return _need(self.stream, "stream (codegen has not run)")


def _need(value: T | None, what: str) -> T:
    if value is None:
        raise InputError("program", f"has no {what}")
    return value
