"""primal-compiler: map transformer LLMs with LoRA adapters onto the PRIMAL PIM accelerator.

The library's public entry points (``tests/test_public_api.py`` pins them):

* :func:`compile`: a model (a built-in name such as ``llama2-13b``, an ONNX
  path, or a :class:`~primal_compiler.ir.model.Model`) with LoRA adapters,
  through a pipeline, onto a target: the compiled Program;
* :func:`run`: replay a compiled Program or a program file (``primal compile
  -o OUT``) and collect the report ``primal run --json`` prints;
* :func:`load_program`: a program file as the Program it was written from
  (model, tiles, layout, KV map, stream, power schedule);
* :func:`load_target`: a bundled target by name, or a target TOML file.

Importing the package imports none of the compiler; each function does.
Every problem is an :class:`~primal_compiler.errors.InputError` naming its
source.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from primal_compiler.executor.cache import ReplayCache
    from primal_compiler.ir.model import Model
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget, Target

    TargetChoice = str | os.PathLike | PrimalTarget  # a bundled name, a TOML path or a loaded target

from primal_compiler.version import __version__

__all__ = ["__version__", "compile", "load_program", "load_target", "run"]


def load_target(name: str | os.PathLike) -> Target:
    """A bundled target (``primal-7nm``, ``h100``, ...) or a target TOML file, strictly validated."""
    from primal_compiler.target import load_target as load

    return load(str(name))


def compile(model: str | os.PathLike | Model, lora: str | None = None, *, target: TargetChoice = "primal-7nm",
            pipeline: str = "default", batch: int | None = None, context: int | None = None,
            generate: int | None = None, verify: bool = False) -> Program:
    """``model`` with LoRA ``lora`` (``"q,v:8"``; ignored for a Model, which carries its own) compiled by
    ``pipeline`` (a bundled name, a TOML path or pipeline text) for ``target`` (a name, a path or a loaded
    PRIMAL target). ``batch`` and ``context`` set the KV space and ``generate`` the tokens per sequence, as
    ``primal run``'s flags do (the first few decode steps replayed record by record, the rest repeating the
    settled one); left out, the pipeline's own options hold. The Program keeps its target for :func:`run`."""
    from primal_compiler.api import compile_model, for_workload
    from primal_compiler.frontend import load_model
    from primal_compiler.ir.model import Model
    from primal_compiler.passmgr import DEFAULT_REPLAYED
    from primal_compiler.pipeline import Workload

    loaded = model if isinstance(model, Model) else load_model(str(model), lora)
    steps = min(generate, DEFAULT_REPLAYED) if generate is not None else None
    work = Workload(batch=batch, context=context, steps=steps, generate=generate)
    return compile_model(loaded, _primal(target), for_workload(pipeline, work), verify=verify)


def load_program(path: str | os.PathLike, target: TargetChoice | None = None) -> Program:
    """The Program a program file or compile output directory was written from, checked against ``target`` (a
    name, a path or a loaded target; default the one the file names)."""
    from pathlib import Path

    from primal_compiler.report.collect import load_compiled

    return load_compiled(Path(path), target).program()


def run(program: Program | str | os.PathLike, target: TargetChoice | None = None, *, control: str | None = None,
        memory: str = "report", critical_path: bool = False, cache: ReplayCache | None = None) -> dict:
    """The run report (``primal run --json``) of a compiled Program (``target``: default the one it was
    compiled for) or of a program file or compile output directory (``target``: default the one it names).
    With ``cache`` (e.g. ``primal_compiler.executor.cache.ReplayCache()``, what ``primal run`` uses), the replay's schedule is read from it
    when it holds this replay and kept in it otherwise (``docs/executor.md``, Replay cache)."""
    from pathlib import Path

    from primal_compiler.errors import InputError
    from primal_compiler.report.collect import load_compiled, replay_report

    if isinstance(program, (str, os.PathLike)):
        c = load_compiled(Path(program), target)
    else:
        from primal_compiler.compiled import Compiled

        target = program.target if target is None else target
        if target is None or program.layout is None or program.stream is None:
            raise InputError("run", "a Program runs with its target and needs the placement and stream of a "
                                    "compile (a program file runs by its path)")
        c = Compiled.of(program, _primal(target))
    return replay_report(c, control=control, critical_path=critical_path, memory=memory, cache=cache)


def _primal(target: TargetChoice) -> PrimalTarget:
    """The PRIMAL target ``target`` names or is; InputError naming it when it is a GPU baseline."""
    from primal_compiler.target.loader import require_primal

    loaded = load_target(target) if isinstance(target, (str, os.PathLike)) else target
    return require_primal(loaded, f"target {getattr(loaded, 'name', target)}")
