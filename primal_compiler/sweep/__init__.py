"""Design-space sweeps: a TOML spec of axes, expanded into points, compiled and replayed on any executor.

>>> from primal_compiler.sweep import load_spec, run_sweep, ResultStore    # doctest: +SKIP
>>> result = run_sweep(load_spec("examples/sweep-tiny.toml"), "results/")  # doctest: +SKIP
>>> table = ResultStore("results/").read()                                 # a pyarrow.Table  # doctest: +SKIP

Modules, one concern each: :mod:`~primal_compiler.sweep.load` (the spec
file and its validation), :mod:`~primal_compiler.sweep.spec` (points, their
stable ids, expansion), :mod:`~primal_compiler.sweep.metrics` (kept metrics
as flat float columns), :mod:`~primal_compiler.sweep.point` (the
task: compile, replay, one row), :mod:`~primal_compiler.sweep.store` (the
Parquet results directory), :mod:`~primal_compiler.sweep.backends` (process
pool or Dask), :mod:`~primal_compiler.sweep.runner` (resume, submit, append,
progress), :mod:`~primal_compiler.sweep.plot` (Pareto front, sensitivity) and
:mod:`~primal_compiler.sweep.command` (``primal sweep``). See ``docs/sweep.md``.
"""

from importlib import import_module
from typing import Any

#: The most points a spec may expand to unless the caller raises it (``primal sweep --max-points N``):
#: a sweep expands its spec twice before the first point runs, ~0.1-0.2 ms and ~1 KiB a point each time.
MAX_POINTS = 100_000

#: Each public name and the module that defines it, imported when first used (PEP 562), so that registering
#: ``primal sweep`` on the command line imports none of the compiler.
_WHERE = {"Point": "spec", "SweepSpec": "spec", "ResultStore": "store", "SweepResult": "runner", "run_sweep": "runner",
          "load_spec": "load", "spec_from_dict": "load"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
