"""Library entry points behind the ``primal`` commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import primal_compiler.transforms  # noqa: F401  (registers every pass)
from primal_compiler import __version__
from primal_compiler.baselines.family import DEFAULT as DEFAULT_BASELINES
from primal_compiler.baselines.family import Selection
from primal_compiler.errors import InputError
from primal_compiler.ir.model import Model
from primal_compiler.ir.model_json import model_to_dict
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
    owns_pe = rram | (t.host == np.arange(len(t)))  # a LoRA tile beyond the layer's RRAM tiles has its own PE
    for ct in range(layout.num_cts):
        m = rram & (t.ct == ct)
        roles = np.bincount(t.role[m], minlength=len(ROLE_CODES))
        desc = " ".join(f"{ROLE_CODES[r].value}:{n}" for r, n in enumerate(roles) if n)
        layer = int(layout.ct_layer[ct])
        name = "head" if layer == program.model.num_layers else str(layer)
        pes = int((owns_pe & (t.ct == ct)).sum())
        lines.append(f"{ct:>5} {name:>6} {int(layout.ct_template[ct]):>8} {pes:>5}  {desc}")
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
        "num_layers": program.model.num_layers, "package_cols": program.layout.package_cols,
        "model_ir": model_to_dict(program.model),
        "kv": {"context": kv.context, "batch": kv.batch, "chunk_tokens": kv.chunk_tokens, "kv_heads": kv.kv_heads,
               "head_dim": kv.head_dim, "kv_bytes": kv.kv_bytes, "banks": kv.banks, "interleave": kv.interleave,
               "chunk_slots": kv.chunk_slots},
    }
    arrays = {f"tile_{k}": v for k, v in t.columns().items()}
    arrays["ct_layer"] = program.layout.ct_layer.astype(np.int32)
    arrays.update(mapped_legs(program.layout))
    arrays.update(kv.arrays())
    for k, v in (program.power or {}).items():
        arrays[k] = np.asarray(v, dtype=np.int64)
    return meta, arrays


def mapped_legs(layout) -> dict[str, np.ndarray]:
    """The transfers the mapping costed: per CT template (CSR) its flows' PEs and hops; die-to-die CT pairs."""
    from primal_compiler.mapping.hops import template_hops

    src, dst, hops = [], [], []
    for tp in layout.templates:
        pe = np.concatenate([tp.slots, tp.hubs]).astype(np.int32)
        src.append(pe[tp.instance.src])
        dst.append(pe[tp.instance.dst])
        hops.append(template_hops(tp).astype(np.int32))
    ptr = np.concatenate([[0], np.cumsum([len(h) for h in hops])]).astype(np.int64)
    return {"ct_template": layout.ct_template.astype(np.int32), "map_tpl_ptr": ptr,
            "map_src_pe": np.concatenate(src), "map_dst_pe": np.concatenate(dst), "map_hops": np.concatenate(hops),
            "map_d2d_src": layout.inter_src.astype(np.int32), "map_d2d_dst": layout.inter_dst.astype(np.int32)}


def write_compiled(program: Program, target, out: Path, force: bool = False, inputs: tuple[str, ...] = ()) -> None:
    """Write OUT/ atomically: placement.npz, placement.txt, summary.json, records.json, program.primal.

    OUT is created, or replaced only when it is an earlier output of ours and ``force`` is set
    (:func:`primal_compiler.outdir.output_directory`).
    """
    from primal_compiler.outdir import output_directory

    need = len(program.tiles) * 64 + (0 if program.stream is None else program.stream.records.nbytes)  # a floor
    with output_directory(out, "compile", force, need, inputs) as tmp:
        np.savez_compressed(tmp / "placement.npz", **program.tiles.columns())
        (tmp / "placement.txt").write_text(placement_table(program))
        (tmp / "summary.json").write_text(json.dumps(summary(program, target), indent=2, sort_keys=True) + "\n")
        records = [{"name": r.name, "spec": r.spec, "details": r.details} for r in program.records]
        (tmp / "records.json").write_text(json.dumps(records, indent=1, sort_keys=True, default=float) + "\n")
        if program.stream is not None:
            from primal_compiler.isa.container import PROGRAM_FILE, save_program

            meta, arrays = program_file(program, target)
            save_program(tmp / PROGRAM_FILE, meta, arrays, program.stream)


def run_pipeline(pipeline: str, batch: int | None, context: int | None, steps: int | None = None) -> str:
    """``pipeline`` with the KV space set to ``batch`` x ``context`` (kv-ring, and blocking's traffic context)
    and ``steps`` decode steps (codegen)."""
    from dataclasses import replace

    from primal_compiler.passmgr import print_pipeline

    passes = list(resolve_pipeline(pipeline))
    for i, p in enumerate(passes):
        changes = {}
        if p.name == "kv-ring":
            changes = {k: v for k, v in (("batch", batch), ("context", context)) if v is not None}
        elif p.name == "blocking" and context is not None:
            changes = {"context": context}
        elif p.name == "codegen" and steps is not None:
            changes = {"steps": steps}
        passes[i] = replace(p, **changes) if changes else p
    return print_pipeline(tuple(passes))


def with_adapters(pipeline: str, adapters: int) -> str:
    """``pipeline`` serving ``adapters`` adapter directories (``codegen.for_adapters``); unchanged for none."""
    from primal_compiler.passmgr import print_pipeline
    from primal_compiler.transforms.codegen import for_adapters

    if adapters < 1:
        return pipeline
    return print_pipeline(tuple(for_adapters(p, adapters) for p in resolve_pipeline(pipeline)))


def decode_steps(stream) -> int:
    """Decode steps of request 0: its decode ARGMAXes over its prefill's (one per pass)."""
    from primal_compiler.isa.opcodes import step_ends

    count = {}
    for s in stream.sections:
        if s.name in ("prefill:0", "decode:0"):
            r = stream.records[s.start : s.stop]
            count[s.name] = int(step_ends(r).sum())
    return count.get("decode:0", 0) // max(1, count.get("prefill:0", 1))


def load_compiled(path: Path, target_name: str | None):
    """(meta, arrays, stream, target, where) of a compiled program file or a compile output directory.

    The one loader of run, viz and the functional replay: the file passes every check of
    :func:`~primal_compiler.isa.container.load_program` for a compiled program (so each part can index
    the others), then must match the target (``target_name``, default the one it names).
    """
    from primal_compiler.isa.container import check_target, load_program, program_path
    from primal_compiler.target import load_target

    file = program_path(path)
    meta, arrays, stream = load_program(file, require_compiled=True)
    target = load_target(target_name or meta["target"])
    check_target(str(file), meta, arrays, target)
    return meta, arrays, stream, target, str(file)


def replay_report(meta: dict, arrays: dict, stream, target, where: str, validate: bool = True,
                  baselines: Selection = DEFAULT_BASELINES, control: str | None = None,
                  critical_path: bool = False, memory: str = "report") -> dict:
    """Replay a program (under ``control``, default the target's) and collect its metrics, hop validation,
    the seed's H100 baseline and the GPU baseline family; with ``critical_path``, also
    ``metrics["critical_path"]``: where request 0's TTFT and ITL go (``executor.critical``). ``memory``
    ``"strict"``: an InputError naming the record, CT, PE and buffer of the first scratchpad overflow;
    ``"report"``: overflows are reported in ``metrics["memory"]`` only."""
    from primal_compiler.baselines.family import family_for_program
    from primal_compiler.executor.critical import critical_path as breakdown
    from primal_compiler.executor.metrics import metrics
    from primal_compiler.executor.replay import replay
    from primal_compiler.executor.validate import validate_hops

    rp = replay(meta, arrays, stream, target, where, control)
    if memory == "strict" and rp.memory is not None:
        from primal_compiler.executor.memory import check

        check(rp.memory, stream.records, where)
    report = {"format": "primal-run", "package_version": __version__, "program": where, "model": meta.get("model"),
              "target": target.name, "pipeline": meta.get("pipeline"), "metrics": metrics(rp)}
    if critical_path:
        report["metrics"]["critical_path"] = breakdown(rp)
    if validate:
        report["validation"] = validate_hops(rp, where)
    report["h100"] = h100_for(meta, report["metrics"])
    report["baselines"] = family_for_program(meta, report["metrics"], baselines)
    return report


def h100_for(meta: dict, m: dict) -> dict | None:
    """The H100 baseline for the program's model, batch, context and prompt (None if the model does not fit)."""
    from dataclasses import fields

    from primal_compiler.baselines.h100 import gpu_costs
    from primal_compiler.ir.model_json import model_from_dict
    from primal_compiler.target import load_target

    if "model_ir" not in meta:
        return None
    model = model_from_dict(meta["model_ir"])
    try:
        costs = gpu_costs(model, load_target("h100"), m["batch"], m["context"], prompt=m.get("prompt_tokens"))
    except InputError as exc:
        return {"error": str(exc)}
    return {f.name: getattr(costs, f.name) for f in fields(costs) if f.name != "details"}
