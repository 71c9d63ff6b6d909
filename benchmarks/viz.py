"""Render time of ``primal viz`` per picture: Llama-2-13B, LoRA r=8 on Q,V, 2048-token context (211 CTs, 1.3M records).

Compiles (cheap Z-curve placement) into a temporary directory unless a
compile output directory is given, loads and replays it once, then times
each picture, the trace and the HTML page. Goal (issue 7): everything renders
in a few seconds beyond the replay.
Run: python benchmarks/viz.py [OUT] [--format png|svg]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from primal_compiler import api
from primal_compiler import compiled
from primal_compiler.frontend import load_model
from primal_compiler.target import load_target
from primal_compiler.viz import breakdown, data, hops, html, placement, power, trace, traffic
from primal_compiler.viz.command import picture_formats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", help="compile output directory (default: compile llama2-13b now)")
    ap.add_argument("--format", default="png", help="png, svg, pdf or several, comma-separated")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    out = Path(args.out) if args.out else Path(tmp.name) / "l13"
    if not args.out:
        target = load_target("primal-7nm")
        t = time.perf_counter()
        program = api.compile_model(load_model("llama2-13b", "q,v:8"), target,
                                    "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg")
        compiled.write_compiled(program, target, out)
        print(f"compile {time.perf_counter() - t:.1f} s")
    d = data.load(out)
    print(f"{d.meta['model']}: {d.num_cts} CTs, {len(d.stream.records):,} records; "
          f"load {d.seconds['load']:.1f} s, replay {d.seconds['replay']:.1f} s")
    dest = Path(tmp.name) / "viz"
    dest.mkdir()
    fmt = picture_formats(args.format)
    steps = [("placement", lambda: placement.render(d, dest, fmt, data.representative_cts(d))),
             ("traffic", lambda: traffic.render(d, dest, fmt)), ("hops", lambda: hops.render([d], dest, fmt)),
             ("power", lambda: power.render(d, dest, fmt)), ("breakdown", lambda: breakdown.render(d, dest, fmt)),
             ("trace", lambda: trace.render(d, dest))]
    total, pictures = 0.0, []
    for name, fn in steps:
        t = time.perf_counter()
        files = fn()
        dt = time.perf_counter() - t
        total += dt
        if name != "trace":
            pictures += files
        sizes = ", ".join(f"{f} {(dest / f).stat().st_size / 1024:.0f} KB" for f in files)
        print(f"  {name:<10} {dt:6.2f} s  {sizes}")
    t = time.perf_counter()
    html.render(d, dest, pictures)
    dt = time.perf_counter() - t
    total += dt
    print(f"  {'html':<10} {dt:6.2f} s  report.html {(dest / 'report.html').stat().st_size / 1024:.0f} KB")
    print(f"render total {total:.1f} s beyond load + replay")


if __name__ == "__main__":
    main()
