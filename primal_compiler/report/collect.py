"""A run report: replay a compiled program and collect its metrics, hop validation and baselines.

``load_compiled`` is the one loader of run, viz and the functional replay;
``replay_report`` the one collector of what ``primal run`` prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TYPE_CHECKING

from primal_compiler.version import __version__
from primal_compiler.baselines.family import DEFAULT as DEFAULT_BASELINES
from primal_compiler.baselines.family import Selection
from primal_compiler.compiled import Compiled
from primal_compiler.errors import InputError

if TYPE_CHECKING:
    from primal_compiler.executor.cache import ReplayCache
    from primal_compiler.isa.stream import Stream


def is_program(spec: str) -> bool:
    """A directory (a model is never one: without a program file it is refused as such), a ``.primal`` path,
    or any regular file starting with the program magic."""
    from primal_compiler.isa.container import is_program_file

    path = Path(spec)
    return path.is_dir() or spec.endswith(".primal") or is_program_file(path)


def load_compiled(path: Path, target_name=None) -> Compiled:
    """The :class:`~primal_compiler.compiled.Compiled` of a program file or a compile output directory.

    The one loader of run, viz and the functional replay: the file passes every check of
    :func:`~primal_compiler.isa.container.load_program` for a compiled program (so each part can index
    the others), then must match the target (``target_name``: a name or path, a loaded target, or None
    for the one the file names).
    """
    from primal_compiler.isa.container import check_target, load_program, program_path
    from primal_compiler.target import load_primal_target, require_primal

    file = program_path(path)
    meta, arrays, stream = load_program(file, require_compiled=True)
    given = target_name is not None and not isinstance(target_name, (str, Path))
    chosen = target_name or meta["target"]
    target = require_primal(target_name, str(file)) if given else load_primal_target(chosen)
    check_target(str(file), meta, arrays, target)
    return Compiled(meta, arrays, stream, target, str(file))


def planned_generation(meta: dict) -> int | None:
    """Tokens per sequence the program's ``codegen`` says it generates (its ``generate``; None: its steps)."""
    from primal_compiler.passmgr import parse_pipeline
    from primal_compiler.transforms.codegen import Codegen

    try:
        passes = parse_pipeline(meta.get("pipeline") or "")
    except InputError:
        return None
    return next((p.generate for p in passes if isinstance(p, Codegen) and p.generate), None)


def replay_report(compiled: Compiled, validate: bool = True,
                  baselines: Selection = DEFAULT_BASELINES, control: str | None = None,
                  critical_path: bool = False, memory: str = "report", generate: int | None = None,
                  cache: ReplayCache | None = None) -> dict:
    """Replay a program (under ``control``, default the target's) and collect its metrics over ``generate``
    tokens per sequence (default: what its codegen plans, :func:`planned_generation`, or the replayed steps
    when the decode has not settled in them: ``metrics["generation"]`` says why), hop validation,
    the seed's H100 baseline and the GPU baseline family; with ``critical_path``, also
    ``metrics["critical_path"]``: where request 0's TTFT and ITL go (``executor.critical``). ``memory``
    ``"strict"``: an InputError naming the record, CT, PE and buffer of the first scratchpad overflow;
    ``"report"``: overflows are reported in ``metrics["memory"]`` only. The replay reads and keeps its
    schedule in ``cache`` (:mod:`~primal_compiler.executor.cache`) unless the critical path is asked for,
    which needs a full replay."""
    from primal_compiler.baselines.family import family_for_program
    from primal_compiler.executor.critical import critical_path as breakdown
    from primal_compiler.executor.metrics import metrics
    from primal_compiler.executor.replay import replay
    from primal_compiler.executor.validate import validate_hops

    meta, where = compiled.meta, compiled.where
    rp = replay(meta, compiled.arrays, compiled.stream, compiled.target, where, control,
                cache=None if critical_path else cache, rows=False)
    if memory == "strict" and rp.memory is not None:
        from primal_compiler.executor.memory import check

        check(rp.memory, compiled.stream.records, where)
    m = metrics(rp, generate=generate or planned_generation(meta), where=where, required=generate is not None)
    report: dict[str, Any] = {"format": "primal-run", "package_version": __version__, "program": where,
                              "model": meta.get("model"), "target": compiled.target.name,
                              "pipeline": meta.get("pipeline"), "metrics": m}
    if critical_path:
        m["critical_path"] = breakdown(rp, generate=m["decode_steps"])
    if validate:
        report["validation"] = validate_hops(rp, where)
    report["h100"] = h100_for(meta, m)
    report["baselines"] = family_for_program(meta, m, baselines)
    return report


def h100_for(meta: dict, m: dict) -> dict | None:
    """The H100 baseline for the program's model, batch, context and prompt (None if the model does not fit)."""
    from dataclasses import fields

    from primal_compiler.baselines.h100 import gpu_costs
    from primal_compiler.ir.model_json import model_from_dict
    from primal_compiler.target import load_gpu_target

    if "model_ir" not in meta:
        return None
    model = model_from_dict(meta["model_ir"])
    try:
        costs = gpu_costs(model, load_gpu_target("h100", "h100"), m["batch"], m["context"],
                          prompt=m.get("prompt_tokens"))
    except InputError as exc:
        return {"error": str(exc)}
    return {f.name: getattr(costs, f.name) for f in fields(costs) if f.name != "details"}


def decode_steps(stream: Stream) -> int:
    """Decode steps of request 0: its decode ARGMAXes over its prefill's (one per pass)."""
    from primal_compiler.isa.opcodes import step_ends

    count = {}
    for s in stream.sections:
        if s.name in ("prefill:0", "decode:0"):
            r = stream.records[s.start : s.stop]
            count[s.name] = int(step_ends(r).sum())
    return count.get("decode:0", 0) // max(1, count.get("prefill:0", 1))
