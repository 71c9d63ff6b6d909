"""Serving from the library: place a model once, then serve traces on it under any policy (docs/serving.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from primal_compiler.errors import InputError
from primal_compiler.executor.cache import ReplayCache
from primal_compiler.ir.program import Program
from primal_compiler.serve.costs import CostTable, Policy
from primal_compiler.serve.report import serve_report
from primal_compiler.serve.sim import simulate
from primal_compiler.serve.trace import Trace, load_trace
from primal_compiler.target.spec import PrimalTarget

Say = Callable[[str], None]


def adapters(given: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, sources) of the adapters given: a PEFT adapter directory is named by its last path component
    and is its own source (its zero blocks); any other name has the source "" (the ``zero_fraction`` sample).
    An InputError when two adapters share a name."""
    names = tuple(Path(a).name if Path(a).is_dir() else a for a in given)
    if len(set(names)) != len(names):
        raise InputError("--adapters", f"names an adapter twice: {' '.join(names)}")
    return names, tuple(a if Path(a).is_dir() else "" for a in given)


def place(model_name: str, lora: str | None, target: PrimalTarget, pipeline: str, context: int, max_batch: int,
          say: Say = lambda line: None, directories: tuple[str, ...] = ()) -> Program:
    """``model_name`` placed by ``pipeline``'s placement passes for ``context`` tokens and up to ``max_batch``
    sequences, its LoRA from ``lora``, else the PEFT ``directories``, else q,v:8; an InputError when it has no
    LoRA to switch, the directories disagree with it, or its KV space does not fit."""
    from primal_compiler import api
    from primal_compiler.frontend import load_model
    from primal_compiler.passmgr import PassManager, parse_pipeline, resolve_pipeline
    from primal_compiler.pipeline import Workload
    from primal_compiler.report.reproduce import PLACEMENT

    model = load_model(model_name, lora if lora is not None or directories else "q,v:8", list(directories) or None)
    if not model.lora_params:
        raise InputError(model_name, "has no LoRA adapter to switch: give --lora (e.g. q,v:8)")
    passes = resolve_pipeline(api.for_workload(pipeline, Workload(batch=max_batch, context=context)))
    head = tuple(p for p in passes if p.provides <= PLACEMENT)
    say(f"serve: placing {model.name} ({', '.join(p.name for p in head)})")
    placed = PassManager(head).run(Program(model=model), target)
    PassManager(parse_pipeline(f"kv-ring{{context={context},batch={max_batch}}}")).run(placed, target)  # it fits
    return placed


def serve_placed(trace: Trace, placed: Program, target: PrimalTarget, context: int, policy: Policy,
                 say: Say = lambda line: None, per_request: bool = True, perfetto: str | None = None,
                 force: bool = False, sources: tuple[str, ...] = (), inputs: tuple[str, ...] = (),
                 cache: ReplayCache | None = None) -> dict:
    """The serve report of ``trace`` on a placed program under ``policy`` (``sources``: per adapter, its PEFT
    directory or ""); with ``perfetto``, its timeline written there too (:mod:`.perfetto`; replaced only with
    ``force``). The shapes' replays read and keep their schedules in ``cache``."""
    table = CostTable(placed, target, context, policy, say, sources, cache)
    run = simulate(trace, table)
    if perfetto is not None:
        from primal_compiler.outdir import output_file
        from primal_compiler.serve.perfetto import trace_json

        with output_file(perfetto, force, inputs=inputs) as f:
            f.write(trace_json(trace, run).encode("utf-8"))
    return serve_report(trace, policy, run, placed.model.name, target.name, context, per_request)


def serve(model_name: str, lora: str | None, given: tuple[str, ...], trace_path: str, target_name: str,
          pipeline: str, context: int, policy: Policy, say: Say = lambda line: None, per_request: bool = True,
          perfetto: str | None = None, force: bool = False, cache: ReplayCache | None = None) -> dict:
    """``primal serve``: load the trace and check the timeline's destination (before any compile), place, replay
    the shapes it needs and simulate it."""
    from primal_compiler.outdir import check_destination, existing
    from primal_compiler.target import load_primal_target

    names, sources = adapters(given)
    trace = load_trace(trace_path, names, context)
    inputs = existing(model_name, trace_path, target_name, pipeline, *given)
    if perfetto is not None:
        check_destination(perfetto, force, directory=False, inputs=inputs)
    target = load_primal_target(target_name)
    placed = place(model_name, lora, target, pipeline, context, policy.max_batch, say,
                   tuple(s for s in sources if s))
    return serve_placed(trace, placed, target, context, policy, say, per_request, perfetto, force, sources, inputs,
                        cache)
