"""Compiling: run a pipeline on a model, and the pipeline text a compile records.

What a compile writes is :mod:`primal_compiler.compiled`; replaying it and
collecting the report, :mod:`primal_compiler.report.collect`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import primal_compiler.transforms  # noqa: F401  (registers every pass)
from primal_compiler.ir.model import Model
from primal_compiler.ir.program import Program
from primal_compiler.passmgr import PassManager, resolve_pipeline
from primal_compiler.pipeline import Pipeline, Workload

if TYPE_CHECKING:
    from primal_compiler.target.spec import PrimalTarget


def compile_model(model: Model, target: PrimalTarget, pipeline: str = "default", verify: bool = False,
                  progress: Callable[[str], None] | None = None) -> Program:
    """Run a pipeline (bundled name, TOML path or pipeline text) on ``model`` (``progress(name)`` as each pass
    starts); the Program keeps ``target``."""
    passes = resolve_pipeline(pipeline)
    return PassManager(passes, verify=verify).run(Program(model=model), target, progress).evolve(target=target)


def pipeline_text(program: Program) -> str:
    """The pipeline that produced ``program``, replayable with ``-p``."""
    return ",".join(r.spec for r in program.records)


def last_details(program: Program, key: str):
    """The newest pass record detail called ``key`` (e.g. ``hops``)."""
    for rec in reversed(program.records):
        if key in rec.details:
            return rec.details[key]
    return None


def for_workload(pipeline: str, workload: Workload) -> str:
    """``pipeline`` (a bundled name, a TOML path or text) as text, with the options ``workload`` sets."""
    return str(Pipeline.parse(pipeline).for_workload(workload))
