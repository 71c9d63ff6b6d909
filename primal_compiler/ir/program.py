"""Program: everything the compiler knows about one model on one target.

A Program is immutable; passes return evolved copies. ``facts`` are the
names of the guarantees established so far (e.g. ``tiles``, ``blocked``,
``placed``, ``kv``, ``stream``); ``records`` is the replayable history of passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from primal_compiler.ir.model import Model
from primal_compiler.ir.tiles import TileTable


@dataclass(frozen=True, eq=False)
class Program:
    model: Model
    facts: frozenset[str] = frozenset()
    records: tuple = ()
    tiles: TileTable | None = None
    layout: Any = None  # primal_compiler.mapping.layout.Layout once blocked
    kv: Any = None  # primal_compiler.codegen.kvmap.KvMap once kv-ring ran
    stream: Any = None  # primal_compiler.isa.stream.Stream once codegen ran
    power: Any = None  # SRPG schedule arrays (pg_ct, pg_on, pg_off) once srpg ran
    pending_details: dict[str, Any] = field(default_factory=dict)

    def evolve(self, **changes: Any) -> Program:
        return replace(self, **changes)

    def verify(self) -> None:
        """Check structural invariants of whatever has been built so far; raise AssertionError."""
        if self.tiles is not None:
            from primal_compiler.mapping.verify import verify_tiles

            verify_tiles(self)
