"""Compile a program whose stream fits one functional run: its prefill length and decode steps.

The prefill length and the number of decode steps per request are fixed
when the stream is emitted (``codegen{prompt=P,steps=S}``), so a replay of
a ``P``-token prompt generating ``N`` tokens needs a program compiled with
``prompt = P`` and ``steps = N - 1`` (at least 1). :func:`compile_for_replay`
runs a pipeline for that :class:`~primal_compiler.pipeline.Workload` (and, if given, the KV context,
which sets blocking's traffic context too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import primal_compiler.transforms  # noqa: F401  (registers every pass)
from primal_compiler.errors import InputError
from primal_compiler.ir.model import Model
from primal_compiler.ir.program import Program
from primal_compiler.passmgr import PassManager
from primal_compiler.pipeline import Pipeline, Workload

if TYPE_CHECKING:
    from primal_compiler.target.spec import PrimalTarget


def compile_for_replay(model: Model, target: PrimalTarget, prompt_len: int, generate: int, pipeline: str = "default",
                       context: int | None = None, adapters: int = 0, prefill_chunk: int | None = None) -> Program:
    """``model`` compiled by ``pipeline`` (which must end with kv-ring and codegen) for a prompt of
    ``prompt_len`` tokens and ``generate`` generated tokens; ``context`` overrides kv-ring's context and
    ``prefill_chunk`` codegen's (and so kv-ring's ``pass_tokens``); ``adapters`` > 1 adapter directories get
    one request each (``Codegen.workload_changes``)."""
    if prompt_len < 1 or generate < 1:
        raise InputError("compile_for_replay", f"prompt_len and generate must be >= 1, got {prompt_len}, {generate}")
    chosen = Pipeline.parse(pipeline)
    if "kv-ring" not in chosen.names or "codegen" not in chosen.names:
        raise InputError(f"pipeline {pipeline}", "needs the kv-ring and codegen passes to emit a stream")
    workload = Workload(context=context, prompt=prompt_len, steps=max(1, generate - 1), adapters=adapters,
                        prefill_chunk=prefill_chunk)
    return PassManager(chosen.for_workload(workload).passes).run(Program(model=model), target)
