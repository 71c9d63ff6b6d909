"""``primal sweep SPEC.toml -o RESULTS``: the command line of :mod:`primal_compiler.sweep`.

``primal_compiler/cli.py`` registers it with ``add_parser(sub)``; the CLI's
``main`` turns an :class:`InputError` into one line on stderr and exit code 2.
``python -m primal_compiler.sweep SPEC -o RESULTS`` runs the same command
through the same ``main``.

Guarantees: the spec (at most ``--max-points`` points, counted before any is
expanded), the ``--x``/``--y`` metrics and the scheduler are all checked
before any point runs; an interrupted sweep (Ctrl-C: ``primal: interrupted``,
exit 130) keeps every finished row, leaves no worker running, and the same
command line resumes it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from primal_compiler.errors import InputError
from primal_compiler.sweep import MAX_POINTS

#: The Pareto plot's default axes (``--x``, ``--y``).
X_DEFAULT, Y_DEFAULT = "tokens_per_s", "tokens_per_j"


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``sweep`` on an argparse subparsers object."""
    from primal_compiler.argtypes import float_arg, int_arg, path_arg, scheduler_arg

    sp = sub.add_parser("sweep", help="compile and replay every point of a design-space sweep into Parquet",
                        description="Run a sweep spec (docs/sweep.md) on a local process pool or a Dask cluster; "
                                    "rows are appended to RESULTS as points finish and a rerun resumes.")
    sp.add_argument("spec", type=path_arg, help="sweep spec (.toml): [sweep] defaults, [axes] or [[grid]] tables")
    sp.add_argument("-o", "--output", required=True, help="results directory (a Parquet dataset)")
    where = sp.add_mutually_exclusive_group()
    where.add_argument("--scheduler", type=scheduler_arg, default=None, help="run on a Dask cluster: tcp://HOST:PORT")
    where.add_argument("--scheduler-file", default=None, help="run on the Dask cluster of this scheduler file")
    sp.add_argument("--connect-timeout", type=float_arg(0.0, 3600.0), default=10.0, metavar="S",
                    help="seconds to wait for the Dask scheduler (default 10)")
    sp.add_argument("--workers", type=int_arg(1, 1024), default=None,
                    help="local worker processes (default: CPU count); with Dask, at most this many points at once")
    sp.add_argument("--flush-every", type=float_arg(0.0, 3600.0), default=1.0, metavar="S",
                    help="write finished rows at least every S seconds (default 1; 0 = as each point finishes)")
    sp.add_argument("--plot", action="store_true", help="draw RESULTS/_plots/pareto.png and RESULTS/_plots/sensitivity.png")
    sp.add_argument("--x", default=X_DEFAULT, help=f"Pareto x metric, METRIC[:max|:min] (default {X_DEFAULT})")
    sp.add_argument("--y", default=Y_DEFAULT, help=f"Pareto y metric, METRIC[:max|:min] (default {Y_DEFAULT})")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar")
    sp.add_argument("--max-points", type=int_arg(1, 10**12), default=MAX_POINTS, metavar="N",
                    help=f"refuse a spec of more than N points (default {MAX_POINTS:,})")
    sp.set_defaults(func=cmd_sweep)
    return sp


def cmd_sweep(args) -> None:
    from primal_compiler.argtypes import unused
    from primal_compiler.sweep.backends import open_backend
    from primal_compiler.sweep.metrics import check_metric, columns
    from primal_compiler.sweep.plot import direction
    from primal_compiler.sweep.runner import run_sweep
    from primal_compiler.sweep.load import load_spec

    for flag, value, default in (("--x", args.x, X_DEFAULT), ("--y", args.y, Y_DEFAULT)):
        if value != default and not args.plot:
            raise unused(flag, "--plot")
    spec = load_spec(args.spec, max_points=args.max_points)
    if args.plot:
        kept = columns(spec.metrics)
        for opt, metric in (("--x", args.x), ("--y", args.y)):
            name, _ = direction(metric)
            check_metric(name, opt)
            if name not in kept and name.split(".")[0] not in spec.metrics:
                raise InputError(opt, f"{name} is not a kept metric of {args.spec}; add it to sweep.metrics")
    with open_backend(args.scheduler, args.scheduler_file, args.workers, args.connect_timeout) as backend:
        result = run_sweep(spec, args.output, backend.executor, slots=backend.slots, progress=not args.no_progress,
                           description=backend.description, rebuild=backend.rebuild,
                           flush_s=max(0.0, args.flush_every))
    print(f"{result.total} points: {result.ran} run now ({result.failed} failed), {result.skipped} already done; "
          f"{result.seconds:.1f} s; results in {args.output}/")
    if args.plot:
        orders: dict[str, list] = {}
        for p in spec.points():
            for name, value in p.axes:
                if value not in orders.setdefault(name, []):
                    orders[name].append(value)
        plot(args.output, spec.axis_names, args.x, args.y, orders)


def plot(out: str, axes, x: str, y: str, orders: dict | None = None) -> None:
    from primal_compiler.outdir import output_directory
    from primal_compiler.sweep.plot import front_table, plot_results
    from primal_compiler.sweep.store import ResultStore

    table = ResultStore(out).read()
    if table is None:
        raise InputError(out, "no results to plot")
    rows = table.to_pylist()
    dest = Path(out) / "_plots"  # the sweep's own: replaced whole, as every output is (docs/outputs.md)
    with output_directory(dest, "sweep", force=True) as tmp:
        names = [p.name for p in plot_results(rows, list(axes), tmp, x, y, orders)]
    print(front_table(rows, list(axes), x, y))
    print("wrote " + ", ".join(str(dest / n) for n in names))
