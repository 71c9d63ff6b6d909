"""What a compile writes: the program file's metadata and arrays, the placement table and summary, OUT/.

``program_file`` is the one place a compiled Program becomes the program
container's metadata and named arrays (placement, KV map, power schedule);
:class:`Compiled` is what run, viz and the functional replay read, the same
value whether it comes from a compile (:meth:`Compiled.of`) or from a file
(:func:`primal_compiler.report.collect.load_compiled`), and
:meth:`Compiled.program` the Program a file was written from; ``write_compiled``
writes a compile output directory atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from primal_compiler.version import __version__
from primal_compiler.api import last_details, pipeline_text
from primal_compiler.errors import InputError
from primal_compiler.ir.facts import Fact
from primal_compiler.ir.model_json import model_to_dict
from primal_compiler.ir.program import Program
from primal_compiler.ir.tiles import ROLE_CODES, Macro
from primal_compiler.mapping.hops import mapped_legs
from primal_compiler.isa.meta import kv_rings
from primal_compiler.isa.schema import POWER
from primal_compiler.isa.stream import Stream
from primal_compiler.passmgr import parse_pipeline
from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True, eq=False)
class Compiled:
    """A compiled program as its container holds it: metadata, named arrays, the stream, the target it was
    compiled for, and where it came from (a file, or the model a compile started from)."""

    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    stream: Stream
    target: PrimalTarget
    where: str

    @classmethod
    def of(cls, program: Program, target: PrimalTarget, where: str | None = None) -> Compiled:
        """A just-compiled Program (it must carry its placement and stream) as its file would hold it."""
        if program.stream is None:
            raise ValueError("a Program without a stream has no program file")
        meta, arrays = program_file(program, target)
        return cls(meta, arrays, program.stream, target, where or program.model.name)

    def program(self) -> Program:
        """The Program the compiler wrote here, as it held it: model, tiles, layout, KV map, stream, power
        schedule, one pass record per pass of the pipeline (its spec; a file keeps no timings or details)
        and the facts those passes leave, so :func:`program_file` of it gives this file's metadata and
        arrays again. The layout is rebuilt by blocking the model again and checked against the stored
        tiles and legs (:func:`~primal_compiler.mapping.blocking.restore_layout`): InputError naming the
        file when they disagree."""
        from primal_compiler.codegen.kvmap import KvMap
        from primal_compiler.ir.model_json import model_from_dict
        from primal_compiler.ir.tiles import COLUMNS, TileTable
        from primal_compiler.mapping.blocking import restore_layout
        from primal_compiler.mapping.lower import geometry
        from primal_compiler.passmgr import PassRecord
        from primal_compiler.transforms.blocking import Blocking

        meta, arrays, target = self.meta, self.arrays, self.target
        try:
            passes = parse_pipeline(meta["pipeline"])
        except InputError as e:
            raise InputError(self.where, f"meta pipeline: {e}") from None
        held: frozenset[Fact] = frozenset()
        for p in passes:
            held = (held - p.invalidates) | p.provides
        blocking = [p for p in passes if isinstance(p, Blocking)]
        if not blocking:
            raise InputError(self.where, "meta pipeline: no blocking pass, so the file holds no placement")
        model = model_from_dict(meta["model_ir"])
        tiles = TileTable.from_columns(**{c: arrays[f"tile_{c}"] for c in COLUMNS})
        layout = restore_layout(model, tiles, geometry(model, target), (target.ct.mesh_rows, target.ct.mesh_cols),
                                blocking[-1].context, target.system.num_cts, arrays, self.where)
        kv_meta = {k: v for k, v in meta["kv"].items() if k != "rings"}
        kv = KvMap(**kv_meta, rings=tuple(kv_rings(meta["kv"], model.num_layers)), ct=arrays["kv_ct"],
                   pe=arrays["kv_pe"], slot=arrays["kv_slot"])
        power = {k: arrays[k] for k in POWER if k in arrays} or None
        return Program(model=model, facts=held, records=tuple(PassRecord(p.name, p.spec(), 0.0) for p in passes),
                       tiles=tiles, layout=layout, kv=kv, stream=self.stream, power=power, target=target)


def placement_table(program: Program) -> str:
    """Human-readable per-CT table: layer, template, tiles per role, PEs used."""
    from primal_compiler.report.text import table

    t, layout = program.need_tiles(), program.need_layout()
    rows = []
    rram = t.macro == Macro.RRAM
    owns_pe = rram | (t.host == np.arange(len(t)))  # a LoRA tile beyond the layer's RRAM tiles has its own PE
    for ct in range(layout.num_cts):
        m = rram & (t.ct == ct)
        roles = np.bincount(t.role[m], minlength=len(ROLE_CODES))
        desc = " ".join(f"{ROLE_CODES[r].value}:{n}" for r, n in enumerate(roles) if n)
        layer = int(layout.ct_layer[ct])
        name = "head" if layer == program.model.num_layers else str(layer)
        pes = int((owns_pe & (t.ct == ct)).sum())
        rows.append((ct, name, int(layout.ct_template[ct]), pes, desc))
    return "\n".join(table(rows, ("ct", "layer", "template", "pes", "matrices (RRAM tiles)"),
                           ("right",) * 4 + ("left",))) + "\n"


def summary(program: Program, target: PrimalTarget) -> dict:
    """Machine-readable facts of a compiled program."""
    t = program.tiles
    out = {
        "format": "primal-placement", "version": 1, "package_version": __version__,
        "model": program.model.name, "target": target.name, "target_hash": target.content_hash,
        "pipeline": pipeline_text(program),
        "passes": [r.spec for r in program.records],
    }
    if t is not None:
        out["rram_tiles"] = int((t.macro == Macro.RRAM).sum())
        out["sram_tiles"] = int((t.macro == Macro.SRAM).sum())
    if program.layout is not None:
        out["cts"] = program.layout.num_cts
        out["hops"] = last_details(program, "hops")
    return out


def program_file(program: Program, target: PrimalTarget) -> tuple[dict, dict[str, np.ndarray]]:
    """Metadata and named arrays (placement, KV map, power schedule) of the program container."""
    t, kv, layout = program.need_tiles(), program.need_kv(), program.need_layout()
    passes = [p for r in program.records for p in parse_pipeline(r.spec)]
    seeds = [p.seed for p in passes if hasattr(p, "seed")]
    kv_meta: dict[str, object] = {
        "context": kv.context, "batch": kv.batch, "chunk_tokens": kv.chunk_tokens, "kv_heads": kv.kv_heads,
        "head_dim": kv.head_dim, "kv_bytes": kv.kv_bytes, "banks": kv.banks, "interleave": kv.interleave,
        "chunk_slots": kv.chunk_slots}
    if any(ring != kv.context for ring in kv.rings):  # a sliding layer's ring (codegen/kvmap.py)
        kv_meta["rings"] = list(kv.rings)
    meta = {
        "format": "primal-program", "package_version": __version__, "model": program.model.name,
        "target": target.name, "target_hash": target.content_hash, "pipeline": pipeline_text(program),
        "seed": seeds[-1] if seeds else None, "num_cts": layout.num_cts,
        "mesh_rows": target.ct.mesh_rows, "mesh_cols": target.ct.mesh_cols,
        "num_layers": program.model.num_layers, "package_cols": layout.package_cols,
        "model_ir": model_to_dict(program.model),
        "kv": kv_meta,
    }
    arrays = {f"tile_{k}": v for k, v in t.columns().items()}
    arrays["ct_layer"] = layout.ct_layer.astype(np.int32)
    arrays.update(mapped_legs(layout))
    arrays.update(kv.arrays())
    for k, v in (program.power or {}).items():
        arrays[k] = np.asarray(v, dtype=np.int64)
    return meta, arrays


def write_compiled(program: Program, target: PrimalTarget, out: Path, force: bool = False, inputs: tuple[str, ...] = (),
                   report: dict | None = None) -> None:
    """Write OUT/ atomically: placement.npz, placement.txt, summary.json, records.json, program.primal, and
    the run's ``report`` when it was replayed, as ``report.json`` and ``report.txt``
    (:func:`~primal_compiler.report.run.saved_report`), ``report.json`` naming the program it was made from
    by the sha256 ``program.primal`` carries (``program_sha256``).

    OUT is created, or replaced only when it is an earlier output of ours and ``force`` is set
    (:func:`primal_compiler.outdir.output_directory`).
    """
    from primal_compiler.outdir import output_directory

    tiles = program.need_tiles()
    need = len(tiles) * 64 + (0 if program.stream is None else program.stream.records.nbytes)  # a floor
    with output_directory(out, "compile", force, need, inputs) as tmp:
        np.savez_compressed(tmp / "placement.npz", allow_pickle=False, **tiles.columns())
        (tmp / "placement.txt").write_text(placement_table(program))
        (tmp / "summary.json").write_text(json.dumps(summary(program, target), indent=2, sort_keys=True) + "\n")
        records = [{"name": r.name, "spec": r.spec, "details": r.details} for r in program.records]
        (tmp / "records.json").write_text(json.dumps(records, indent=1, sort_keys=True, default=float) + "\n")
        if program.stream is not None:
            from primal_compiler.isa.container import PROGRAM_FILE, program_sha256, save_program

            meta, arrays = program_file(program, target)
            save_program(tmp / PROGRAM_FILE, meta, arrays, program.stream)
            if report is not None:
                from primal_compiler.report.run import saved_report

                texts = saved_report(report | {"program_sha256": program_sha256(tmp / PROGRAM_FILE)})
                (tmp / "report.json").write_text(texts[0])
                (tmp / "report.txt").write_text(texts[1])
