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

from primal_compiler.sweep.runner import SweepResult, run_sweep
from primal_compiler.sweep.load import load_spec, spec_from_dict
from primal_compiler.sweep.spec import Point, SweepSpec
from primal_compiler.sweep.store import ResultStore

__all__ = ["Point", "ResultStore", "SweepResult", "SweepSpec", "load_spec", "run_sweep", "spec_from_dict"]
