"""Library entry points behind the ``primal`` commands."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

import primal_compiler.transforms  # noqa: F401  (registers every pass)
from primal_compiler import __version__
from primal_compiler.ir.model import Model
from primal_compiler.ir.program import Program
from primal_compiler.ir.tiles import ROLE_CODES, Macro
from primal_compiler.passmgr import PassManager, parse_pipeline, resolve_pipeline


def compile_model(model: Model, target, pipeline: str = "default", verify: bool = False) -> Program:
    """Run a pipeline (bundled name, TOML path or pipeline text) on ``model``."""
    passes = resolve_pipeline(pipeline)
    return PassManager(passes, verify=verify).run(Program(model=model), target)


def pipeline_text(program: Program) -> str:
    """The pipeline that produced ``program``, replayable with ``-p``."""
    return ",".join(r.spec for r in program.records)


def last_details(program: Program, key: str):
    """The newest pass record detail called ``key`` (e.g. ``hops``)."""
    for rec in reversed(program.records):
        if key in rec.details:
            return rec.details[key]
    return None


def placement_table(program: Program) -> str:
    """Human-readable per-CT table: layer, template, tiles per role, PEs used."""
    t, layout = program.tiles, program.layout
    lines = [f"{'ct':>5} {'layer':>6} {'template':>8} {'pes':>5}  matrices (RRAM tiles)"]
    rram = t.macro == Macro.RRAM
    for ct in range(layout.num_cts):
        m = rram & (t.ct == ct)
        roles = np.bincount(t.role[m], minlength=len(ROLE_CODES))
        desc = " ".join(f"{ROLE_CODES[r].value}:{n}" for r, n in enumerate(roles) if n)
        layer = int(layout.ct_layer[ct])
        name = "head" if layer == program.model.num_layers else str(layer)
        lines.append(f"{ct:>5} {name:>6} {int(layout.ct_template[ct]):>8} {int(m.sum()):>5}  {desc}")
    return "\n".join(lines) + "\n"


def summary(program: Program, target) -> dict:
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


def program_file(program: Program, target) -> tuple[dict, dict[str, np.ndarray]]:
    """Metadata and named arrays (placement, KV map, power schedule) of the program container."""
    t, kv = program.tiles, program.kv
    passes = [p for r in program.records for p in parse_pipeline(r.spec)]
    seeds = [p.seed for p in passes if hasattr(p, "seed")]
    meta = {
        "format": "primal-program", "package_version": __version__, "model": program.model.name,
        "target": target.name, "target_hash": target.content_hash, "pipeline": pipeline_text(program),
        "seed": seeds[-1] if seeds else None, "num_cts": program.layout.num_cts,
        "mesh_rows": target.ct.mesh_rows, "mesh_cols": target.ct.mesh_cols,
        "num_layers": program.model.num_layers,
        "kv": {"context": kv.context, "batch": kv.batch, "chunk_tokens": kv.chunk_tokens, "kv_heads": kv.kv_heads,
               "head_dim": kv.head_dim, "kv_bytes": kv.kv_bytes, "banks": kv.banks, "chunk_slots": kv.chunk_slots},
    }
    arrays = {f"tile_{k}": v for k, v in t.columns().items()}
    arrays["ct_layer"] = program.layout.ct_layer.astype(np.int32)
    arrays.update(kv.arrays())
    for k, v in (program.power or {}).items():
        arrays[k] = np.asarray(v, dtype=np.int64)
    return meta, arrays


def write_compiled(program: Program, target, out: Path) -> None:
    """Write OUT/ atomically: placement.npz, placement.txt, summary.json, records.json, program.primal."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        np.savez_compressed(tmp / "placement.npz", **program.tiles.columns())
        (tmp / "placement.txt").write_text(placement_table(program))
        (tmp / "summary.json").write_text(json.dumps(summary(program, target), indent=2, sort_keys=True) + "\n")
        records = [{"name": r.name, "spec": r.spec, "details": r.details} for r in program.records]
        (tmp / "records.json").write_text(json.dumps(records, indent=1, sort_keys=True, default=float) + "\n")
        if program.stream is not None:
            from primal_compiler.isa.container import PROGRAM_FILE, save_program

            meta, arrays = program_file(program, target)
            save_program(tmp / PROGRAM_FILE, meta, arrays, program.stream)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
