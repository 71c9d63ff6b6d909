"""``primal viz OUT [-o DIR] [--compare OTHER] [--format png|svg]``: every picture, the trace and the HTML report.

:func:`render_all` replays OUT (and OTHER), renders into a temporary
directory beside DIR and renames it into place, so DIR is either the old
result or the complete new one, never half-written. (Rendering the pictures
in forked worker processes was measured slower on 2 cores than in process:
copy-on-write faults of the replay's arrays cost more than the overlap.)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from primal_compiler.errors import InputError
from primal_compiler.outdir import check_destination, output_directory
from primal_compiler.terminal import steps

if TYPE_CHECKING:
    from primal_compiler.executor.cache import ReplayCache

ORDER = ("placement", "traffic", "hops", "power", "adapters", "thermal", "breakdown")


def render_all(out, dest=None, compare=None, fmt: str = "png", target: str | None = None,
               max_events: int | None = None, force: bool = False, cache: ReplayCache | None = None,
               critical_path: bool = False) -> dict:
    """Render everything for compile output ``out`` into ``dest`` (default OUT/viz), every picture in each
    format ``fmt`` lists (comma-separated, of :data:`~primal_compiler.viz.style.FORMATS`: ``png,pdf`` gives
    vector output next to the PNG).

    ``dest`` is created, or replaced only when it is an earlier output of ours and ``force`` is set;
    it may not be OUT, OTHER or a directory holding them (:func:`primal_compiler.outdir.output_directory`).

    The replays read and keep their schedules in ``cache`` (:mod:`~primal_compiler.executor.cache`); with
    ``critical_path``, OUT's is a full one and the page breaks its TTFT and ITL down along the critical path.
    Returns ``{"dir", "files", "seconds"}``; seconds hold load, replay, each job's own time and
    ``render`` (wall time of all rendering).
    """
    from primal_compiler.viz import adapters, breakdown, data, hops, html, placement, power, thermal, trace, traffic

    formats = picture_formats(fmt)
    out = Path(out)
    dest = Path(dest) if dest is not None else out / "viz"
    inputs = (out,) if compare is None else (out, Path(compare))
    check_destination(dest, force, directory=True, inputs=inputs)  # refuse before the replay, not after
    with steps(1 + (compare is not None) + len(ORDER) + 2, "viz") as step, \
            output_directory(dest, "viz", force, inputs=inputs) as tmp:
        step("load and replay")
        d = data.load(out, target, cache, critical_path)
        timings: dict[str, float] = dict(d.seconds)
        runs = [d]
        other = None
        if compare is not None:
            step("load and replay OTHER")
            other = data.load(compare, target, cache)
            if other.meta.get("model") != d.meta.get("model"):
                raise InputError("--compare", f"compares two runs of one model: {out} is {d.meta.get('model')}, "
                                              f"{compare} is {other.meta.get('model')}")
            timings["compare load+replay"] = sum(other.seconds.values())
            runs.append(other)
        start = time.perf_counter()
        work = {
            "trace": lambda: trace.render(d, tmp, max_events or trace.MAX_EVENTS),
            "traffic": lambda: traffic.render(d, tmp, formats),
            "placement": lambda: placement.render(d, tmp, formats, data.representative_cts(d)),
            "power": lambda: power.render(d, tmp, formats),
            "adapters": lambda: adapters.render(d, tmp, formats),
            "thermal": lambda: thermal.render(d, tmp, formats),
            "breakdown": lambda: breakdown.render(d, tmp, formats),
            "hops": lambda: hops.render(runs, tmp, formats),
        }
        done = {}
        for name, job in work.items():
            step(name)
            t = time.perf_counter()
            done[name] = (job(), time.perf_counter() - t)
        pictures = [f for name in ORDER for f in done[name][0]]
        timings.update({name: done[name][1] for name in (*ORDER, "trace")})
        step("html")
        t = time.perf_counter()
        files = pictures + done["trace"][0]
        files += html.render(d, tmp, pictures, other)
        timings["html"] = time.perf_counter() - t
        timings["render"] = time.perf_counter() - start
    return {"dir": str(dest), "files": files, "seconds": timings}


def picture_formats(text: str) -> tuple[str, ...]:
    """The formats ``--format`` names (comma-separated, each once, of :data:`~primal_compiler.viz.style.FORMATS`);
    InputError naming ``--format`` on anything else."""
    from primal_compiler.viz.style import FORMATS

    formats = tuple(text.split(","))
    if not all(f in FORMATS for f in formats) or len(set(formats)) != len(formats):
        raise InputError("--format", f"expected one or more of {', '.join(FORMATS)}, comma-separated and each once "
                                     f"(png,pdf: vector output next to the PNG), got {text[:40]!r}")
    return formats


def cmd_viz(args) -> None:
    from primal_compiler.argtypes import replay_cache

    result = render_all(args.out, args.output, args.compare, args.format, args.target, args.max_events, args.force,
                        replay_cache(args), args.critical_path)
    t = result["seconds"]
    print(f"wrote {result['dir']}/ ({', '.join(result['files'])})")
    own = ", ".join(f"{k} {t[k]:.2f} s" for k in (*ORDER, "trace", "html"))
    extra = "".join(f", {k} {t[k]:.1f} s" for k in ("critical path", "compare load+replay") if k in t)
    print(f"load {t['load']:.1f} s, replay {t['replay']:.1f} s{extra}, render {t['render']:.1f} s ({own})")


def add_parser(sub) -> None:
    """Register ``viz`` on an argparse subparsers object."""
    from primal_compiler.argtypes import add_cache_flag, int_arg, path_arg

    sp = sub.add_parser("viz", help="placement maps, traffic heat-maps, hop histograms, power timelines, "
                                    "a Perfetto trace and an HTML report of a compiled program")
    sp.add_argument("out", type=path_arg, help="compile output directory (holding program.primal and records.json)")
    sp.add_argument("-o", "--output", default=None, help="directory to write (default OUT/viz)")
    sp.add_argument("--force", action="store_true", help="replace DIR if it is an earlier primal viz output")
    sp.add_argument("--compare", type=path_arg, default=None, metavar="OTHER_OUT",
                    help="a second compile output drawn beside OUT in the hop histogram")
    sp.add_argument("--format", default="png", metavar="FMT[,FMT]",
                    help="picture formats, comma-separated, of png, svg and pdf (default png; png,pdf: vector output "
                         "for a paper next to the PNG the page inlines)")
    sp.add_argument("--target", default=None, help="target name (default: the one recorded in the program)")
    sp.add_argument("--max-events", type=int_arg(1, 2_000_000), default=None,  # Perfetto's UI loads a few million
                    help=f"cap on trace events (default {200_000:,}, at most 2,000,000); closer spans merge to meet it")
    sp.add_argument("--critical-path", action="store_true",
                    help="break request 0's TTFT and ITL down along their critical paths on the page (a full replay)")
    add_cache_flag(sp)
    sp.set_defaults(func=cmd_viz)
