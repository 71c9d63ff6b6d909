"""Compile a program whose stream fits one functional run: its prefill length and decode steps.

The prefill length and the number of decode steps per request are fixed
when the stream is emitted (``codegen{prompt=P,steps=S}``), so a replay of
a ``P``-token prompt generating ``N`` tokens needs a program compiled with
``prompt = P`` and ``steps = N - 1`` (at least 1). :func:`compile_for_replay`
runs a pipeline with those codegen options (and, if given, the KV context).
"""

from __future__ import annotations

from dataclasses import replace

import primal_compiler.transforms  # noqa: F401  (registers every pass)
from primal_compiler.errors import InputError
from primal_compiler.ir.model import Model
from primal_compiler.ir.program import Program
from primal_compiler.passmgr import PassManager, resolve_pipeline
from primal_compiler.transforms.codegen import for_adapters


def compile_for_replay(model: Model, target, prompt_len: int, generate: int, pipeline: str = "default",
                       context: int | None = None, adapters: int = 0) -> Program:
    """``model`` compiled by ``pipeline`` (which must end with kv-ring and codegen) for a prompt of
    ``prompt_len`` tokens and ``generate`` generated tokens; ``context`` overrides kv-ring's context;
    ``adapters`` > 1 adapter directories get one request each (``codegen.for_adapters``)."""
    if prompt_len < 1 or generate < 1:
        raise InputError("compile_for_replay", f"prompt_len and generate must be >= 1, got {prompt_len}, {generate}")
    passes = list(resolve_pipeline(pipeline))
    names = [p.name for p in passes]
    if "kv-ring" not in names or "codegen" not in names:
        raise InputError(f"pipeline {pipeline}", "needs the kv-ring and codegen passes to emit a stream")
    for i, p in enumerate(passes):
        if p.name == "kv-ring" and context is not None:
            passes[i] = replace(p, context=context, chunk_tokens=min(p.chunk_tokens, context))
        elif p.name == "codegen":
            passes[i] = for_adapters(replace(p, prompt=prompt_len, steps=max(1, generate - 1)), adapters)
    return PassManager(tuple(passes)).run(Program(model=model), target)
