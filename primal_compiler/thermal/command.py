"""``primal thermal OUT [--phase decode|prefill] [--ambient-c C] [--limit-c C] [--json]``: every CT's temperature
under a replayed phase's power, sustained, and with ``--limit-c`` the thermal-aware policy that keeps every die
under a limit and its cost (docs/thermal.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from primal_compiler.terminal import steps
from primal_compiler.thermal import PHASES


def cmd_thermal(args) -> None:
    from primal_compiler.argtypes import replay_cache
    from primal_compiler.executor.metrics import decode_steady
    from primal_compiler.executor.replay import replay
    from primal_compiler.report import collect
    from primal_compiler.report.run import read_saved
    from primal_compiler.target import require_primal, with_overrides
    from primal_compiler.thermal.report import render_run, render_thermal, run_power, thermal_report

    with steps(2, "thermal") as step:  # a bar on a terminal: the replay, then the package's RC network
        step("load and replay")
        c = collect.load_compiled(Path(args.out), args.target)
        saved = read_saved(Path(c.where))  # OUT/report.json, refused here when it is another program's
        target = c.target
        if args.ambient_c is not None:
            target = require_primal(with_overrides(target, {"thermal.ambient_c": args.ambient_c}), c.where)
        rp = replay(c.meta, c.arrays, c.stream, target, c.where, cache=replay_cache(args), rows=False)
        step("temperatures")
        steady = decode_steady(rp, 0, collect.planned_generation(c.meta))
        report = thermal_report(rp, args.phase, steady=steady)
    report["program"] = c.where
    if saved is not None:  # the run's own figure for this window, and whether these dies add up to it
        report["run"] = run_power(saved, str(Path(c.where).parent / "report.json"), report, rp, args.ambient_c is None,
                                  steady.generated)
    text = render_thermal(report) + (render_run(report["run"]) if saved is not None else "")
    if args.limit_c is not None:
        from primal_compiler.thermal.throttle import render_throttle, throttle_for_limit

        report["policy"] = throttle_for_limit(c, target, args.limit_c, args.phase,
                                              lambda line: print(line, file=sys.stderr, flush=True), rp)
        text += "\n" + render_throttle(report["policy"])
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else text)


def add_parser(sub) -> None:
    """Register ``thermal`` on an argparse subparsers object."""
    from primal_compiler.argtypes import add_cache_flag, float_arg, path_arg

    sp = sub.add_parser("thermal", help="every CT's die temperature and ADC offset under a replayed phase's "
                                        "power, sustained (a compact RC model of the package)")
    sp.add_argument("out", type=path_arg, help="compile output directory or program.primal")
    sp.add_argument("--target", default=None, help="target name (default: the one recorded in the program)")
    sp.add_argument("--phase", choices=PHASES, default="decode",
                    help="whose power heats the package: the decode window (default) or the prefill")
    sp.add_argument("--ambient-c", type=float_arg(-40.0, 125.0), default=None,
                    help="air temperature at the heat sink in degC (default: the target's thermal.ambient_c)")
    sp.add_argument("--limit-c", type=float_arg(-40.0, 125.0), default=None,
                    help="thermal-aware policy: the most RRAM macros per CT converting at once that keep every die "
                         "at or under this temperature (degC), found by replaying, and its cost in throughput")
    sp.add_argument("--json", action="store_true", help="print one JSON object (per-CT power and temperature too)")
    add_cache_flag(sp)
    sp.set_defaults(func=cmd_thermal)
