"""``primal viz OUT [-o DIR] [--compare OTHER] [--format png|svg]``: every picture, the trace and the HTML report.

:func:`render_all` replays OUT (and OTHER), renders into a temporary
directory beside DIR and renames it into place, so DIR is either the old
result or the complete new one, never half-written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from primal_compiler.errors import InputError

FORMATS = ("png", "svg")


def render_all(out, dest=None, compare=None, fmt: str = "png", target: str | None = None,
               max_events: int | None = None) -> dict:
    """Render everything for compile output ``out`` into ``dest`` (default OUT/viz); returns files and timings."""
    from primal_compiler.viz import breakdown, data, hops, html, placement, power, trace, traffic

    if fmt not in FORMATS:
        raise InputError("--format", f"expected one of {', '.join(FORMATS)}, got {fmt!r}")
    out = Path(out)
    dest = Path(dest) if dest is not None else out / "viz"
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = timings.get(name, 0.0) + now - clock
        clock = now

    d = data.load(out, target)
    timings.update(d.seconds)
    clock = time.perf_counter()
    runs = [d]
    if compare is not None:
        other = data.load(compare, target)
        timings["compare load+replay"] = sum(other.seconds.values())
        clock = time.perf_counter()
        runs.append(other)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        pictures = placement.render(d, tmp, fmt, data.representative_cts(d))
        mark("placement")
        pictures += traffic.render(d, tmp, fmt)
        mark("traffic")
        pictures += hops.render(runs, tmp, fmt)
        mark("hops")
        pictures += power.render(d, tmp, fmt)
        mark("power")
        pictures += breakdown.render(d, tmp, fmt)
        mark("breakdown")
        files = pictures + trace.render(d, tmp, max_events or trace.MAX_EVENTS)
        mark("trace")
        order = ["placement", "traffic", "hops", "power", "breakdown"]
        shown = sorted(pictures, key=lambda p: (order.index(p.split(".")[0].split("_")[0]), p))
        files += html.render(d, tmp, shown, timings)
        mark("html")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"dir": str(dest), "files": files, "seconds": timings}


def cmd_viz(args) -> None:
    result = render_all(args.out, args.output, args.compare, args.format, args.target, args.max_events)
    t = result["seconds"]
    render = sum(v for k, v in t.items() if k not in ("load", "replay", "compare load+replay"))
    print(f"wrote {result['dir']}/ ({', '.join(result['files'])})")
    print(f"load {t['load']:.1f} s, replay {t['replay']:.1f} s, render {render:.1f} s ("
          + ", ".join(f"{k} {v:.2f} s" for k, v in t.items() if k not in ("load", "replay")) + ")")


def add_parser(sub) -> None:
    """Register ``viz`` on an argparse subparsers object."""
    sp = sub.add_parser("viz", help="placement maps, traffic heat-maps, hop histograms, power timelines, "
                                    "a Perfetto trace and an HTML report of a compiled program")
    sp.add_argument("out", help="compile output directory (holding program.primal and records.json)")
    sp.add_argument("-o", "--output", default=None, help="directory to write (default OUT/viz); replaced atomically")
    sp.add_argument("--compare", default=None, metavar="OTHER_OUT",
                    help="a second compile output drawn beside OUT in the hop histogram")
    sp.add_argument("--format", choices=FORMATS, default="png", help="picture format (default png)")
    sp.add_argument("--target", default=None, help="target name (default: the one recorded in the program)")
    sp.add_argument("--max-events", type=int, default=None,
                    help=f"cap on trace events (default {200_000:,}); closer spans merge to meet it")
    sp.set_defaults(func=cmd_viz)
