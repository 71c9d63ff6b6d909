"""Compiling: run a pipeline on a model, and the pipeline text a compile records.

What a compile writes is :mod:`primal_compiler.compiled`; replaying it and
collecting the report, :mod:`primal_compiler.report.collect`.
"""

from __future__ import annotations

import primal_compiler.transforms  # noqa: F401  (registers every pass)
from primal_compiler.ir.model import Model
from primal_compiler.ir.program import Program
from primal_compiler.passmgr import PassManager, resolve_pipeline


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
