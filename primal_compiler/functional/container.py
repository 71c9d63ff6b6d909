"""Rebuild what the replay needs from a program file: model IR, tile table, KV map and stream.

``program_from_container(meta, arrays, stream, where)`` takes what
:func:`primal_compiler.isa.container.load_program` returns for a file that
``primal compile`` wrote (``meta["model_ir"]``, the ``tile_*`` placement
columns, ``meta["kv"]`` with ``kv_ct``/``kv_pe``/``kv_slot``) and returns a
:class:`~primal_compiler.ir.program.Program` with ``model``, ``tiles``,
``kv`` and ``stream`` set: everything :func:`replay_functional` reads. A program
file reaches it through :func:`primal_compiler.report.collect.load_compiled`, the one loader
of run, viz and the functional replay.
"""

from __future__ import annotations

from primal_compiler.codegen.kvmap import KvMap
from primal_compiler.errors import InputError
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.ir.model_json import model_from_dict
from primal_compiler.ir.program import Program
from primal_compiler.ir.tiles import COLUMNS, TileTable
from primal_compiler.isa.schema import check_compiled


def program_from_container(meta: dict, arrays: dict, stream, where: str) -> Program:
    """The replayable program of a loaded program file; InputError naming ``where`` when a part is missing
    or the parts disagree (the checks of :func:`~primal_compiler.isa.schema.check_compiled`, which
    ``load_program`` already ran on a compiled program file)."""
    missing = [k for k in ("model_ir", "kv") if k not in meta]
    missing += [n for n in [f"tile_{c}" for c in COLUMNS] + ["kv_ct", "kv_pe", "kv_slot"] if n not in arrays]
    if missing:
        raise InputError(where, f"lacks {', '.join(missing)}, which the functional replay needs; recompile it")
    check_compiled(meta, arrays, stream, where)
    model = model_from_dict(meta["model_ir"])
    tiles = TileTable.from_columns(**{c: arrays[f"tile_{c}"] for c in COLUMNS})
    kv = KvMap(**meta["kv"], ct=arrays["kv_ct"], pe=arrays["kv_pe"], slot=arrays["kv_slot"])
    return Program(model=model, tiles=tiles, kv=kv, stream=stream,
                   facts=facts(Fact.TILES, Fact.PLACED, Fact.KV, Fact.STREAM))
